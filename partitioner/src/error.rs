use std::fmt;

/// Why a partitioner call refused its input. Every variant names the offending argument.
#[derive(Debug, Clone, PartialEq)]
pub enum PartitionError {
    /// A grid dimension is zero, or F x H x W overflows `u32`.
    BadGrid {
        /// Frames, height, width as given.
        dims: [u64; 3],
    },
    /// A buffer's length disagrees with what the other arguments imply.
    LengthMismatch {
        /// The argument's name.
        what: &'static str,
        /// Length implied by the other arguments.
        expected: usize,
        /// Length received.
        got: usize,
    },
    /// A value is NaN or infinite (or negative where only non-negative values make sense).
    BadValue {
        /// The argument's name.
        what: &'static str,
        /// Index of the first bad element.
        index: usize,
        /// The bad value.
        value: f32,
    },
    /// The requested patch count is outside `1..=tokens`.
    BadPatchCount {
        /// Requested R.
        requested: u32,
        /// Tokens in the grid: the largest R allowed.
        tokens: u32,
    },
    /// The salient-token mask selects no prompt token, so no saliency map can be built.
    NoSalientTokens,
    /// A layout's parts are inconsistent (token in two patches, empty patch, index out of range).
    BadLayout(String),
    /// Controller bounds or settings are out of range.
    BadConfig(String),
}

impl fmt::Display for PartitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadGrid { dims } => write!(
                f,
                "grid {}x{}x{} (frames x height x width) must have every dimension >= 1 and at most 2^24 tokens",
                dims[0], dims[1], dims[2]
            ),
            Self::LengthMismatch { what, expected, got } => {
                write!(f, "{what} has length {got}, expected {expected}")
            }
            Self::BadValue { what, index, value } => {
                write!(f, "{what}[{index}] = {value} is not a finite non-negative number")
            }
            Self::BadPatchCount { requested, tokens } => write!(
                f,
                "patch count R = {requested} is out of range: need 1 <= R <= {tokens} (tokens in the grid)"
            ),
            Self::NoSalientTokens => write!(
                f,
                "the salient-token mask selects no prompt token; use the uniform partitioner instead"
            ),
            Self::BadLayout(why) => write!(f, "invalid patch layout: {why}"),
            Self::BadConfig(why) => write!(f, "invalid configuration: {why}"),
        }
    }
}

impl std::error::Error for PartitionError {}
