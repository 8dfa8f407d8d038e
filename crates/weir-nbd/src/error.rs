//! Errors: per-request NBD error values, and fatal protocol violations.

use std::fmt;

/// NBD error values (the `error` field of replies), as `proto.md` restricts them.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Perm,
    Io,
    NoMem,
    Inval,
    NoSpc,
    Overflow,
    NotSup,
    Shutdown,
}

impl ErrorCode {
    pub fn to_wire(self) -> u32 {
        match self {
            ErrorCode::Perm => 1,
            ErrorCode::Io => 5,
            ErrorCode::NoMem => 12,
            ErrorCode::Inval => 22,
            ErrorCode::NoSpc => 28,
            ErrorCode::Overflow => 75,
            ErrorCode::NotSup => 95,
            ErrorCode::Shutdown => 108,
        }
    }
    /// Decodes a nonzero wire value; unknown values read as `Inval` (as the spec
    /// tells clients to treat them). Zero is not an error and gives `None`.
    pub fn from_wire(value: u32) -> Option<ErrorCode> {
        Some(match value {
            0 => return None,
            1 => ErrorCode::Perm,
            5 => ErrorCode::Io,
            12 => ErrorCode::NoMem,
            28 => ErrorCode::NoSpc,
            75 => ErrorCode::Overflow,
            95 => ErrorCode::NotSup,
            108 => ErrorCode::Shutdown,
            _ => ErrorCode::Inval,
        })
    }
    /// Maps an OS errno (from a failed backend call) to the NBD value to send.
    pub fn from_errno(errno: i32) -> ErrorCode {
        match errno {
            1 | 13 | 30 => ErrorCode::Perm,    // EPERM, EACCES, EROFS
            12 => ErrorCode::NoMem,            // ENOMEM
            22 => ErrorCode::Inval,            // EINVAL
            27 | 28 | 122 => ErrorCode::NoSpc, // EFBIG, ENOSPC, EDQUOT
            75 => ErrorCode::Overflow,         // EOVERFLOW
            95 => ErrorCode::NotSup,           // EOPNOTSUPP
            108 => ErrorCode::Shutdown,        // ESHUTDOWN
            _ => ErrorCode::Io,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Perm => "EPERM",
            ErrorCode::Io => "EIO",
            ErrorCode::NoMem => "ENOMEM",
            ErrorCode::Inval => "EINVAL",
            ErrorCode::NoSpc => "ENOSPC",
            ErrorCode::Overflow => "EOVERFLOW",
            ErrorCode::NotSup => "ENOTSUP",
            ErrorCode::Shutdown => "ESHUTDOWN",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request that fails with an NBD error value (the connection goes on).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct NbdError {
    pub code: ErrorCode,
    pub message: String,
}

impl NbdError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> NbdError {
        NbdError {
            code,
            message: message.into(),
        }
    }
    pub fn inval(message: impl Into<String>) -> NbdError {
        NbdError::new(ErrorCode::Inval, message)
    }
}

/// A violation after which the connection must be closed (hard disconnect).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad magic: expected {expected:#x}, got {got:#x}")]
    BadMagic { expected: u64, got: u64 },
    #[error("client flags {0:#x} contain bits the server did not advertise")]
    BadClientFlags(u32),
    #[error("export {0:?} is not available (NBD_OPT_EXPORT_NAME cannot report errors, closing)")]
    UnknownExport(String),
    #[error("option NBD_OPT_EXPORT_NAME with {0} bytes of data is too long")]
    ExportNameTooLong(u32),
    #[error("server does not support fixed newstyle negotiation")]
    NotFixedNewstyle,
    #[error("server sent an unexpected {what}: {detail}")]
    Unexpected { what: &'static str, detail: String },
    #[error("server refused option {option}: reply {reply:#x} {message:?}")]
    OptionRefused {
        option: u32,
        reply: u32,
        message: String,
    },
    #[error("connection was used after it finished")]
    Finished,
}

impl ProtocolError {
    pub(crate) fn unexpected(what: &'static str, detail: impl Into<String>) -> ProtocolError {
        ProtocolError::Unexpected {
            what,
            detail: detail.into(),
        }
    }
}
