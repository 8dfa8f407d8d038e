//! Transmission-phase requests: header codec, a streaming decoder, and the one
//! validation function every request goes through before it reaches storage.

use crate::consts::*;
use crate::error::{ErrorCode, NbdError, ProtocolError};
use crate::export::ExportInfo;
use crate::wire::{InBuf, Reader};

/// A request header as it travels (no meaning attached yet).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    /// Command type (`CMD_*`), possibly unknown.
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    /// Decodes the 28-byte header. Fails (close the connection) on a bad magic.
    pub fn decode(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtocolError> {
        let mut r = Reader::new(bytes);
        let magic = r.u32().unwrap_or_default();
        if magic != REQUEST_MAGIC {
            return Err(ProtocolError::BadMagic {
                expected: REQUEST_MAGIC as u64,
                got: magic as u64,
            });
        }
        Ok(RequestHeader {
            flags: r.u16().unwrap_or_default(),
            command: r.u16().unwrap_or_default(),
            handle: r.u64().unwrap_or_default(),
            offset: r.u64().unwrap_or_default(),
            length: r.u32().unwrap_or_default(),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Whether `length` bytes of payload follow this header on the wire
    /// (only `NBD_CMD_WRITE`; extended headers are not negotiated).
    pub fn has_payload(&self) -> bool {
        self.command == CMD_WRITE
    }
}

/// A decoded request: header plus the WRITE payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub header: RequestHeader,
    /// The WRITE payload. `None` for a WRITE whose payload exceeded the maximum
    /// and was discarded unread ([`validate`] then fails it with EINVAL).
    pub payload: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecodeState {
    Header,
    Payload(RequestHeader),
    Discard(RequestHeader, u32),
}

/// Streaming request decoder: feed bytes, pull whole requests.
#[derive(Debug)]
pub struct RequestDecoder {
    buf: InBuf,
    state: DecodeState,
    max_payload: u32,
    failed: bool,
}

impl RequestDecoder {
    /// `max_payload` bounds what is buffered for one WRITE; longer payloads are
    /// discarded as they arrive (the request is still returned, then fails
    /// validation), so memory stays bounded whatever the client sends.
    pub fn new(max_payload: u32) -> RequestDecoder {
        RequestDecoder {
            buf: InBuf::default(),
            state: DecodeState::Header,
            max_payload,
            failed: false,
        }
    }

    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend(data);
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete request, `Ok(None)` if more bytes are needed, `Err` if the
    /// stream is broken (close the connection; further calls keep failing).
    pub fn next_request(&mut self) -> Result<Option<Request>, ProtocolError> {
        if self.failed {
            return Err(ProtocolError::Finished);
        }
        loop {
            match self.state {
                DecodeState::Header => {
                    if self.buf.len() < REQUEST_HEADER_LEN {
                        return Ok(None);
                    }
                    let mut h = [0u8; REQUEST_HEADER_LEN];
                    h.copy_from_slice(&self.buf.as_slice()[..REQUEST_HEADER_LEN]);
                    let header = match RequestHeader::decode(&h) {
                        Ok(h) => h,
                        Err(e) => {
                            self.failed = true;
                            return Err(e);
                        }
                    };
                    self.buf.consume(REQUEST_HEADER_LEN);
                    if !header.has_payload() {
                        return Ok(Some(Request {
                            header,
                            payload: None,
                        }));
                    }
                    self.state = if header.length > self.max_payload {
                        DecodeState::Discard(header, header.length)
                    } else {
                        DecodeState::Payload(header)
                    };
                }
                DecodeState::Payload(header) => {
                    let n = header.length as usize;
                    if self.buf.len() < n {
                        return Ok(None);
                    }
                    let payload = self.buf.as_slice()[..n].to_vec();
                    self.buf.consume(n);
                    self.state = DecodeState::Header;
                    return Ok(Some(Request {
                        header,
                        payload: Some(payload),
                    }));
                }
                DecodeState::Discard(header, remaining) => {
                    let n = (remaining as usize).min(self.buf.len());
                    self.buf.consume(n);
                    let remaining = remaining - n as u32;
                    if remaining > 0 {
                        self.state = DecodeState::Discard(header, remaining);
                        return Ok(None);
                    }
                    self.state = DecodeState::Header;
                    return Ok(Some(Request {
                        header,
                        payload: None,
                    }));
                }
            }
        }
    }
}

/// A request that passed [`validate`]: in range, flags known and negotiated,
/// permitted on this export.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
        fast_zero: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    /// One chunk per selected context: `base:allocation` (`context_id`, when
    /// selected) and the `weir:exclusive` lease context, if granted.
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
        context_id: Option<u32>,
    },
    /// Soft disconnect: finish in-flight requests, send nothing, close.
    Disconnect,
}

impl Command {
    /// Bytes moved by this command (READ/WRITE), for accounting and QoS cost.
    pub fn data_bytes(&self) -> u32 {
        match *self {
            Command::Read { length, .. } | Command::Write { length, .. } => length,
            _ => 0,
        }
    }
    pub fn is_read(&self) -> bool {
        matches!(self, Command::Read { .. })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ValidRequest {
    pub handle: u64,
    pub command: Command,
}

/// The one validation every request goes through.
///
/// Unknown command or flag, flag not negotiated or not valid for the command:
/// EINVAL. Write-type command on a read-only export: EPERM. Beyond the end:
/// ENOSPC for WRITE/WRITE_ZEROES, EINVAL otherwise. Unaligned to the minimum
/// block size, or longer than the maximum payload (READ/WRITE/CACHE): EINVAL.
/// A WRITE whose payload was discarded by the decoder is EINVAL.
pub fn validate(request: &Request, export: &ExportInfo) -> Result<ValidRequest, NbdError> {
    let h = &request.header;
    check_flags(h.command, h.flags, export)?;
    let command = command_of(h, export)?;
    if command == Command::Disconnect {
        return Ok(ValidRequest {
            handle: h.handle,
            command,
        });
    }
    let writes = matches!(
        command,
        Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
    );
    if writes && export.read_only() {
        return Err(NbdError::new(ErrorCode::Perm, "export is read-only"));
    }
    if matches!(command, Command::Write { .. }) && request.payload.is_none() {
        return Err(NbdError::inval(format!(
            "write of {} bytes exceeds the maximum payload of {} bytes",
            h.length, export.block_size.max_payload_bytes
        )));
    }
    if command != Command::Flush {
        check_range(&command, h.offset, h.length, export)?;
    }
    Ok(ValidRequest {
        handle: h.handle,
        command,
    })
}

/// The flags a command may carry on this connection (FUA only if the export
/// offers it; DF and FAST_ZERO only if negotiated): else EINVAL.
fn check_flags(command: u16, flags: u16, export: &ExportInfo) -> Result<(), NbdError> {
    let allowed = match command {
        CMD_READ => CMD_FLAG_DF,
        CMD_WRITE | CMD_TRIM => 0,
        CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        CMD_FLUSH | CMD_CACHE | CMD_DISC => 0,
        other => return Err(NbdError::inval(format!("unknown command type {other}"))),
    } | if export.has_flag(FLAG_SEND_FUA) {
        CMD_FLAG_FUA
    } else {
        0
    };
    if flags & !allowed != 0 {
        return Err(NbdError::inval(format!(
            "command flags {:#x} not valid for {} on this connection",
            flags & !allowed,
            command_name(command)
        )));
    }
    if flags & CMD_FLAG_DF != 0 && !export.has_flag(FLAG_SEND_DF) {
        return Err(NbdError::inval("NBD_CMD_FLAG_DF needs structured replies"));
    }
    if flags & CMD_FLAG_FAST_ZERO != 0 && !export.has_flag(FLAG_SEND_FAST_ZERO) {
        return Err(NbdError::inval("NBD_CMD_FLAG_FAST_ZERO was not negotiated"));
    }
    Ok(())
}

/// The command a header asks for (its flags already checked): FLUSH with a
/// range, or BLOCK_STATUS without a selected context or with length 0, is EINVAL.
fn command_of(h: &RequestHeader, export: &ExportInfo) -> Result<Command, NbdError> {
    let (offset, length, flags) = (h.offset, h.length, h.flags);
    let fua = flags & CMD_FLAG_FUA != 0;
    Ok(match h.command {
        CMD_DISC => Command::Disconnect,
        CMD_FLUSH => {
            if offset != 0 || length != 0 {
                return Err(NbdError::inval("NBD_CMD_FLUSH needs offset and length 0"));
            }
            Command::Flush
        }
        CMD_READ => Command::Read {
            offset,
            length,
            df: flags & CMD_FLAG_DF != 0,
        },
        CMD_WRITE => Command::Write {
            offset,
            length,
            fua,
        },
        CMD_TRIM => Command::Trim {
            offset,
            length,
            fua,
        },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            fua,
            no_hole: flags & CMD_FLAG_NO_HOLE != 0,
            fast_zero: flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_CACHE => Command::Cache { offset, length },
        CMD_BLOCK_STATUS => {
            let context_id = export.base_allocation_id;
            let selected = context_id.is_some() || export.exclusive_lease.is_some();
            if !(selected && export.structured_replies) {
                return Err(NbdError::inval(
                    "NBD_CMD_BLOCK_STATUS without a selected metadata context",
                ));
            }
            if length == 0 {
                return Err(NbdError::inval("NBD_CMD_BLOCK_STATUS with length 0"));
            }
            Command::BlockStatus {
                offset,
                length,
                req_one: flags & CMD_FLAG_REQ_ONE != 0,
                context_id,
            }
        }
        other => return Err(NbdError::inval(format!("unknown command type {other}"))),
    })
}

/// A command's range: inside the export (else ENOSPC for WRITE and
/// WRITE_ZEROES, EINVAL for the rest), aligned to the minimum block size, and
/// for READ, WRITE and CACHE no longer than the maximum payload.
fn check_range(
    command: &Command,
    offset: u64,
    length: u32,
    export: &ExportInfo,
) -> Result<(), NbdError> {
    let end = offset.checked_add(length as u64);
    if end.is_none_or(|end| end > export.size_bytes) {
        let code = if matches!(command, Command::Write { .. } | Command::WriteZeroes { .. }) {
            ErrorCode::NoSpc
        } else {
            ErrorCode::Inval
        };
        return Err(NbdError::new(
            code,
            format!(
                "range {offset}+{length} exceeds the export size of {} bytes",
                export.size_bytes
            ),
        ));
    }
    let min = export.block_size.min_bytes.max(1) as u64;
    if !offset.is_multiple_of(min) || !(length as u64).is_multiple_of(min) {
        return Err(NbdError::inval(format!(
            "range {offset}+{length} is not aligned to {min} bytes"
        )));
    }
    let bounded = matches!(
        command,
        Command::Read { .. } | Command::Write { .. } | Command::Cache { .. }
    );
    if bounded && length > export.block_size.max_payload_bytes {
        return Err(NbdError::inval(format!(
            "length {length} exceeds the maximum payload of {} bytes",
            export.block_size.max_payload_bytes
        )));
    }
    Ok(())
}

/// Name of a command type for messages.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "NBD_CMD_READ",
        CMD_WRITE => "NBD_CMD_WRITE",
        CMD_DISC => "NBD_CMD_DISC",
        CMD_FLUSH => "NBD_CMD_FLUSH",
        CMD_TRIM => "NBD_CMD_TRIM",
        CMD_CACHE => "NBD_CMD_CACHE",
        CMD_WRITE_ZEROES => "NBD_CMD_WRITE_ZEROES",
        CMD_BLOCK_STATUS => "NBD_CMD_BLOCK_STATUS",
        _ => "unknown command",
    }
}
