/* A second translation unit including the header: links with bad_input.c to prove the header
 * defines nothing that would collide. */
#include "flashdiff.h"

unsigned second_unit_version(void) { return fd_version(); }
