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
    /// What the value says, for an error that came without a message (a simple
    /// reply carries none: "EPERM: " told an operator nothing).
    pub fn meaning(self) -> &'static str {
        match self {
            ErrorCode::Perm => "not permitted (a read-only export, or one another client holds)",
            ErrorCode::Io => "input/output error",
            ErrorCode::NoMem => "out of memory",
            ErrorCode::Inval => "invalid request",
            ErrorCode::NoSpc => "no space left",
            ErrorCode::Overflow => "beyond the export's end",
            ErrorCode::NotSup => "not supported",
            ErrorCode::Shutdown => "the server is shutting down",
        }
    }

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
#[error("{code}: {}", if message.is_empty() { code.meaning() } else { message })]
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
    /// What [`ProtocolError::Unexpected`] is on the server's side: the client's.
    #[error("client sent an unexpected {what}: {detail}")]
    ClientSent { what: &'static str, detail: String },
    #[error("{}", refused_text(*option, *reply, message))]
    OptionRefused {
        option: u32,
        reply: u32,
        message: String,
    },
    #[error("connection was used after it finished")]
    Finished,
}

/// "the server refused NBD_OPT_GO (7): NBD_REP_ERR_TLS_REQD (0x80000005), ..."
/// with the server's message and, for the refusals a user can act on, what to do.
fn refused_text(option: u32, reply: u32, message: &str) -> String {
    use crate::consts::*;
    let option_name = match option {
        OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        OPT_ABORT => "NBD_OPT_ABORT",
        OPT_LIST => "NBD_OPT_LIST",
        OPT_STARTTLS => "NBD_OPT_STARTTLS",
        OPT_INFO => "NBD_OPT_INFO",
        OPT_GO => "NBD_OPT_GO",
        OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "option",
    };
    let reply_name = match reply {
        REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP",
        REP_ERR_POLICY => "NBD_REP_ERR_POLICY",
        REP_ERR_INVALID => "NBD_REP_ERR_INVALID",
        REP_ERR_PLATFORM => "NBD_REP_ERR_PLATFORM",
        REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD",
        REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN",
        REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN",
        REP_ERR_BLOCK_SIZE_REQD => "NBD_REP_ERR_BLOCK_SIZE_REQD",
        REP_ERR_TOO_BIG => "NBD_REP_ERR_TOO_BIG",
        _ => "reply",
    };
    let mut text =
        format!("the server refused {option_name} ({option}): {reply_name} ({reply:#x})");
    if !message.is_empty() {
        text += &format!(": {message:?}");
    }
    let hint = match (option, reply) {
        (_, REP_ERR_TLS_REQD) => Some("the server requires TLS (an nbds:// address)"),
        (OPT_STARTTLS, _) => Some("the server does not offer TLS (an nbd:// address)"),
        (OPT_GO | OPT_INFO | OPT_EXPORT_NAME, REP_ERR_UNKNOWN) => Some("no such export"),
        _ => None,
    };
    if let Some(hint) = hint {
        text += &format!(" — {hint}");
    }
    text
}

impl ProtocolError {
    pub(crate) fn unexpected(what: &'static str, detail: impl Into<String>) -> ProtocolError {
        ProtocolError::Unexpected {
            what,
            detail: detail.into(),
        }
    }

    /// A client's violation, as the server's logs name it.
    pub(crate) fn client_sent(what: &'static str, detail: impl Into<String>) -> ProtocolError {
        ProtocolError::ClientSent {
            what,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    /// An error without a message says what its value means.
    #[test]
    fn an_error_without_a_message_is_explained() {
        let e = super::NbdError::new(super::ErrorCode::Perm, "");
        assert!(e.to_string().starts_with("EPERM: not permitted"), "{e}");
        let e = super::NbdError::new(super::ErrorCode::Io, "disk gone");
        assert_eq!(e.to_string(), "EIO: disk gone");
    }

    use super::*;
    use crate::consts::*;

    #[test]
    fn refusals_name_the_option_and_the_reply_and_say_what_to_do() {
        let refused = |option, reply, message: &str| {
            ProtocolError::OptionRefused {
                option,
                reply,
                message: message.into(),
            }
            .to_string()
        };
        assert_eq!(
            refused(OPT_GO, REP_ERR_TLS_REQD, ""),
            "the server refused NBD_OPT_GO (7): NBD_REP_ERR_TLS_REQD (0x80000005) \
             — the server requires TLS (an nbds:// address)"
        );
        assert_eq!(
            refused(OPT_STARTTLS, REP_ERR_POLICY, "no TLS here"),
            "the server refused NBD_OPT_STARTTLS (5): NBD_REP_ERR_POLICY (0x80000002): \
             \"no TLS here\" — the server does not offer TLS (an nbd:// address)"
        );
        assert!(refused(OPT_GO, REP_ERR_UNKNOWN, "x").ends_with("— no such export"));
        assert_eq!(
            refused(99, REP_ERR_BIT | 77, ""),
            "the server refused option (99): reply (0x8000004d)"
        );
    }
}
