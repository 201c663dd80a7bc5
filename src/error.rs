//! The one error type of smelt. Messages follow PyTorch's wording where it has one.

/// Everything that can go wrong because of user input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the op (broadcasting, matmul, views, reductions).
    #[error("{0}")]
    Shape(String),
    /// A dtype the op does not accept.
    #[error("{0}")]
    DType(String),
    /// A dimension or element index outside its range.
    #[error("{0}")]
    Index(String),
    /// Tensors on different devices, or a device that is not there.
    #[error("{0}")]
    Device(String),
    /// A bad argument value (negative size, zero step, malformed equation, ...).
    #[error("{0}")]
    Value(String),
    /// Malformed `.smelt` text, with its position.
    #[error("{file}:{line}:{col}: {msg}")]
    Parse {
        /// The file name given to the parser.
        file: String,
        /// Line, 1-based.
        line: usize,
        /// Column, 1-based, in characters.
        col: usize,
        /// What is wrong.
        msg: String,
    },
    /// An allocation the memory cannot hold (host or device), saying how much was asked for.
    #[error("{0}")]
    OutOfMemory(String),
    /// Reading or writing files.
    #[error("{0}")]
    Io(String),
    /// A valid request this build cannot serve (an op on a backend that lacks it).
    #[error("{0}")]
    Unsupported(String),
    /// A collective that failed across processes: ranks that disagree on its arguments, a
    /// rank that did not join in time, or a transport error.
    #[error("{0}")]
    Distributed(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e.to_string())
    }
}

/// `bail!(Shape, "...")` returns early with the given error kind and a formatted message.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::Error::$kind(format!($($arg)*)))
    };
}
