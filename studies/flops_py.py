"""FLOPs of what PyTorch runs, for the Python studies (studies/diffusers_caches.py,
studies/diffusers_wall.py)."""

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class Flops(TorchDispatchMode):
    """FLOPs of what runs under it, by torch's own formulas (`flop_registry`, those of
    FlopCounterMode) for every op that has one; the ops run as they are. FlopCounterMode's
    module tracking and decomposition of uncounted ops are left out, which makes it about
    twice as fast; `diffusers_caches.check_flops` verifies it counts the same as
    FlopCounterMode."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        f = flop_registry.get(func._overloadpacket)
        if f is not None:
            self.total += f(*args, **kwargs, out_val=out)
        return out
