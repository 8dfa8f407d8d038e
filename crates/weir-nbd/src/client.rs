//! Client side: handshake state machine, request encoding, reply decoding with
//! reassembly of structured replies. Used by the load generator and the tests.

use std::collections::{HashMap, VecDeque};

use crate::consts::*;
use crate::error::{ErrorCode, NbdError, ProtocolError};
use crate::export::{BlockSize, ExportInfo, ExportListing};
use crate::reply::Extent;
use crate::request::RequestHeader;
use crate::wire::{InBuf, Reader, put_u16, put_u32, put_u64};

/// What the client wants from the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientGoal {
    /// Open `export_name` for transmission (`NBD_OPT_GO`, falling back to
    /// `NBD_OPT_EXPORT_NAME` on servers without it).
    Go,
    /// Ask for the export's details (`NBD_OPT_INFO`), then abort.
    Info,
    /// List the exports (`NBD_OPT_LIST`), then abort.
    List,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    pub export_name: String,
    pub goal: ClientGoal,
    /// Ask for structured replies.
    pub structured_replies: bool,
    /// Metadata contexts to select (needs structured replies), e.g. `base:allocation`.
    pub meta_contexts: Vec<String>,
    /// Send `NBD_OPT_STARTTLS` first: the handshake pauses at
    /// [`ClientOutcome::StartTls`] for the caller's TLS handshake and goes on, over
    /// TLS, after [`ClientHandshake::tls_started`]. A server that refuses it fails
    /// the handshake (no fallback to plain text).
    pub starttls: bool,
}

impl ClientConfig {
    /// Open `export_name` with structured replies and `base:allocation`.
    pub fn go(export_name: impl Into<String>) -> ClientConfig {
        ClientConfig {
            export_name: export_name.into(),
            goal: ClientGoal::Go,
            structured_replies: true,
            meta_contexts: vec![BASE_ALLOCATION.to_string()],
            starttls: false,
        }
    }
    pub fn list() -> ClientConfig {
        ClientConfig {
            export_name: String::new(),
            goal: ClientGoal::List,
            structured_replies: false,
            meta_contexts: vec![],
            starttls: false,
        }
    }
}

/// An export as the client learned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientExport {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    pub block_size: Option<BlockSize>,
    /// Selected metadata contexts: (id, name).
    pub meta_contexts: Vec<(u32, String)>,
}

impl ClientExport {
    /// The negotiated state in the form [`ClientSession`] (and `validate`) use.
    pub fn export_info(&self) -> ExportInfo {
        ExportInfo {
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            transmission_flags: self.transmission_flags,
            structured_replies: self.structured_replies,
            base_allocation_id: self
                .meta_contexts
                .iter()
                .find(|(_, n)| n == BASE_ALLOCATION)
                .map(|(id, _)| *id),
            block_size: self.block_size.unwrap_or_default(),
            exclusive_lease: self
                .meta_contexts
                .iter()
                .find_map(|(_, n)| n.strip_prefix(WEIR_EXCLUSIVE_PREFIX))
                .map(str::to_string),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOutcome {
    /// Transmission phase entered.
    Connected(ClientExport),
    /// `NBD_OPT_INFO` answered (an `NBD_OPT_ABORT` is in the output).
    Info(ClientExport),
    /// `NBD_OPT_LIST` answered (an `NBD_OPT_ABORT` is in the output).
    Listed(Vec<ExportListing>),
    /// `NBD_OPT_STARTTLS` acknowledged: run the TLS handshake on the socket now,
    /// then call [`ClientHandshake::tls_started`] and go on feeding the
    /// decrypted bytes.
    StartTls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CState {
    Greeting,
    OptionReply(u32),
    ExportNameReply,
    /// STARTTLS acknowledged; no input until [`ClientHandshake::tls_started`].
    AwaitingTls,
    Done,
}

/// Largest option reply the client accepts.
const MAX_OPTION_REPLY: usize = 1 << 20;

#[derive(Debug)]
pub struct ClientHandshake {
    config: ClientConfig,
    state: CState,
    input: InBuf,
    output: Vec<u8>,
    no_zeroes: bool,
    structured: bool,
    contexts: Vec<(u32, String)>,
    listing: Vec<ExportListing>,
    export: ClientExport,
    got_export_info: bool,
}

impl ClientHandshake {
    pub fn new(config: ClientConfig) -> ClientHandshake {
        let export = ClientExport {
            name: config.export_name.clone(),
            description: String::new(),
            size_bytes: 0,
            transmission_flags: 0,
            structured_replies: false,
            block_size: None,
            meta_contexts: vec![],
        };
        ClientHandshake {
            config,
            state: CState::Greeting,
            input: InBuf::default(),
            output: Vec::new(),
            no_zeroes: false,
            structured: false,
            contexts: vec![],
            listing: vec![],
            export,
            got_export_info: false,
        }
    }

    pub fn output(&self) -> &[u8] {
        &self.output
    }
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }
    /// Bytes received after the handshake ended (start of transmission).
    pub fn take_leftover(&mut self) -> Vec<u8> {
        self.input.take_all()
    }

    /// The TLS handshake that followed [`ClientOutcome::StartTls`] succeeded: the
    /// next option is in the output (send it over TLS).
    pub fn tls_started(&mut self) -> Result<Option<ClientOutcome>, ProtocolError> {
        if self.state != CState::AwaitingTls {
            return Err(ProtocolError::unexpected(
                "TLS start",
                "no STARTTLS acknowledged",
            ));
        }
        if !self.input.is_empty() {
            return Err(ProtocolError::unexpected(
                "data",
                "plain text after the STARTTLS acknowledgement",
            ));
        }
        Ok(self.next_step(OPT_STARTTLS))
    }

    fn send_option(&mut self, option: u32, data: &[u8]) {
        put_u64(&mut self.output, IHAVEOPT);
        put_u32(&mut self.output, option);
        put_u32(&mut self.output, data.len() as u32);
        self.output.extend_from_slice(data);
        self.state = CState::OptionReply(option);
    }

    fn name_and_queries(&self) -> Vec<u8> {
        let mut d = Vec::new();
        put_u32(&mut d, self.config.export_name.len() as u32);
        d.extend_from_slice(self.config.export_name.as_bytes());
        put_u32(&mut d, self.config.meta_contexts.len() as u32);
        for q in &self.config.meta_contexts {
            put_u32(&mut d, q.len() as u32);
            d.extend_from_slice(q.as_bytes());
        }
        d
    }

    fn send_info_or_go(&mut self, option: u32) {
        let mut d = Vec::new();
        put_u32(&mut d, self.config.export_name.len() as u32);
        d.extend_from_slice(self.config.export_name.as_bytes());
        put_u16(&mut d, 3);
        put_u16(&mut d, INFO_NAME);
        put_u16(&mut d, INFO_DESCRIPTION);
        put_u16(&mut d, INFO_BLOCK_SIZE);
        self.send_option(option, &d);
    }

    /// Sends the next option after `after` (0: the first one).
    fn next_step(&mut self, after: u32) -> Option<ClientOutcome> {
        if after == 0 && self.config.starttls {
            self.send_option(OPT_STARTTLS, &[]);
            return None;
        }
        // The options a plain-text handshake starts with come first over TLS too.
        let after = if after == OPT_STARTTLS { 0 } else { after };
        let goal = self.config.goal.clone();
        if goal == ClientGoal::List {
            if after == 0 {
                self.send_option(OPT_LIST, &[]);
                return None;
            }
            self.send_option(OPT_ABORT, &[]);
            self.state = CState::Done;
            return Some(ClientOutcome::Listed(std::mem::take(&mut self.listing)));
        }
        if after == 0 && self.config.structured_replies {
            self.send_option(OPT_STRUCTURED_REPLY, &[]);
            return None;
        }
        if (after == 0 || after == OPT_STRUCTURED_REPLY)
            && self.structured
            && !self.config.meta_contexts.is_empty()
        {
            let d = self.name_and_queries();
            self.send_option(OPT_SET_META_CONTEXT, &d);
            return None;
        }
        match goal {
            ClientGoal::Go => self.send_info_or_go(OPT_GO),
            ClientGoal::Info => self.send_info_or_go(OPT_INFO),
            ClientGoal::List => {}
        }
        None
    }

    /// Feeds bytes from the server. `Err`: give up and close.
    pub fn input(&mut self, data: &[u8]) -> Result<Option<ClientOutcome>, ProtocolError> {
        self.input.extend(data);
        loop {
            match self.state {
                CState::Done => return Ok(None),
                CState::AwaitingTls => {
                    if !self.input.is_empty() {
                        return Err(ProtocolError::unexpected(
                            "data",
                            "plain text after the STARTTLS acknowledgement",
                        ));
                    }
                    return Ok(None);
                }
                CState::Greeting => {
                    let mut r = Reader::new(self.input.as_slice());
                    let (Some(magic), Some(opt_magic), Some(flags)) = (r.u64(), r.u64(), r.u16())
                    else {
                        return Ok(None);
                    };
                    self.input.consume(18);
                    if magic != NBDMAGIC {
                        return Err(ProtocolError::BadMagic {
                            expected: NBDMAGIC,
                            got: magic,
                        });
                    }
                    if opt_magic != IHAVEOPT || flags & FLAG_FIXED_NEWSTYLE == 0 {
                        return Err(ProtocolError::NotFixedNewstyle);
                    }
                    self.no_zeroes = flags & FLAG_NO_ZEROES != 0;
                    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
                    if self.no_zeroes {
                        cflags |= FLAG_C_NO_ZEROES;
                    }
                    put_u32(&mut self.output, cflags);
                    if let Some(outcome) = self.next_step(0) {
                        return Ok(Some(outcome));
                    }
                }
                CState::ExportNameReply => {
                    let need = if self.no_zeroes { 10 } else { 134 };
                    if self.input.len() < need {
                        return Ok(None);
                    }
                    let mut r = Reader::new(self.input.as_slice());
                    self.export.size_bytes = r.u64().unwrap_or_default();
                    self.export.transmission_flags = r.u16().unwrap_or_default();
                    self.input.consume(need);
                    self.state = CState::Done;
                    return Ok(Some(self.finish_connected()));
                }
                CState::OptionReply(option) => {
                    let mut r = Reader::new(self.input.as_slice());
                    let (Some(magic), Some(reply_option), Some(reply_type), Some(len)) =
                        (r.u64(), r.u32(), r.u32(), r.u32())
                    else {
                        return Ok(None);
                    };
                    if magic != REPLY_MAGIC {
                        return Err(ProtocolError::BadMagic {
                            expected: REPLY_MAGIC,
                            got: magic,
                        });
                    }
                    if reply_option != option {
                        return Err(ProtocolError::unexpected(
                            "option reply",
                            format!("for option {reply_option}, sent {option}"),
                        ));
                    }
                    let len = len as usize;
                    if len > MAX_OPTION_REPLY {
                        return Err(ProtocolError::unexpected(
                            "option reply",
                            format!("{len} bytes long"),
                        ));
                    }
                    if self.input.len() < 20 + len {
                        return Ok(None);
                    }
                    let payload = self.input.as_slice()[20..20 + len].to_vec();
                    self.input.consume(20 + len);
                    if let Some(outcome) = self.on_reply(option, reply_type, &payload)? {
                        return Ok(Some(outcome));
                    }
                }
            }
        }
    }

    fn finish_connected(&mut self) -> ClientOutcome {
        self.export.structured_replies = self.structured;
        self.export.meta_contexts = std::mem::take(&mut self.contexts);
        ClientOutcome::Connected(self.export.clone())
    }

    fn on_reply(
        &mut self,
        option: u32,
        reply_type: u32,
        payload: &[u8],
    ) -> Result<Option<ClientOutcome>, ProtocolError> {
        let refused = |reply_type: u32, payload: &[u8]| ProtocolError::OptionRefused {
            option,
            reply: reply_type,
            message: String::from_utf8_lossy(payload).into_owned(),
        };
        match (option, reply_type) {
            (OPT_LIST, REP_SERVER) => {
                let mut r = Reader::new(payload);
                let bad = || ProtocolError::unexpected("NBD_REP_SERVER", "malformed");
                let n = r.u32().ok_or_else(bad)? as usize;
                let name = r.bytes(n).ok_or_else(bad)?;
                self.listing.push(ExportListing {
                    name: String::from_utf8_lossy(name).into_owned(),
                    description: String::from_utf8_lossy(r.rest()).into_owned(),
                });
                Ok(None)
            }
            (OPT_STARTTLS, REP_ACK) => {
                self.state = CState::AwaitingTls;
                Ok(Some(ClientOutcome::StartTls))
            }
            (OPT_STRUCTURED_REPLY, REP_ACK) => {
                self.structured = true;
                Ok(self.next_step(option))
            }
            (OPT_STRUCTURED_REPLY, t) if t & REP_ERR_BIT != 0 => Ok(self.next_step(option)),
            (OPT_SET_META_CONTEXT, REP_META_CONTEXT) => {
                let mut r = Reader::new(payload);
                let id = r.u32().ok_or_else(|| {
                    ProtocolError::unexpected("NBD_REP_META_CONTEXT", "too short")
                })?;
                self.contexts
                    .push((id, String::from_utf8_lossy(r.rest()).into_owned()));
                Ok(None)
            }
            (OPT_SET_META_CONTEXT, REP_ACK) => Ok(self.next_step(option)),
            (OPT_SET_META_CONTEXT, t) if t & REP_ERR_BIT != 0 => {
                self.contexts.clear();
                Ok(self.next_step(option))
            }
            (OPT_INFO | OPT_GO, REP_INFO) => {
                let mut r = Reader::new(payload);
                let bad = || ProtocolError::unexpected("NBD_REP_INFO", "malformed");
                match r.u16().ok_or_else(bad)? {
                    INFO_EXPORT => {
                        self.export.size_bytes = r.u64().ok_or_else(bad)?;
                        self.export.transmission_flags = r.u16().ok_or_else(bad)?;
                        self.got_export_info = true;
                    }
                    INFO_NAME => self.export.name = String::from_utf8_lossy(r.rest()).into_owned(),
                    INFO_DESCRIPTION => {
                        self.export.description = String::from_utf8_lossy(r.rest()).into_owned()
                    }
                    INFO_BLOCK_SIZE => {
                        self.export.block_size = Some(BlockSize {
                            min_bytes: r.u32().ok_or_else(bad)?,
                            preferred_bytes: r.u32().ok_or_else(bad)?,
                            max_payload_bytes: r.u32().ok_or_else(bad)?,
                        })
                    }
                    _ => {} // unknown information types are ignored
                }
                Ok(None)
            }
            (OPT_INFO | OPT_GO, REP_ACK) => {
                if !self.got_export_info {
                    return Err(ProtocolError::unexpected(
                        "NBD_REP_ACK",
                        "no NBD_INFO_EXPORT before it",
                    ));
                }
                if option == OPT_GO {
                    self.state = CState::Done;
                    return Ok(Some(self.finish_connected()));
                }
                self.send_option(OPT_ABORT, &[]);
                self.state = CState::Done;
                self.export.structured_replies = self.structured;
                self.export.meta_contexts = std::mem::take(&mut self.contexts);
                Ok(Some(ClientOutcome::Info(self.export.clone())))
            }
            (OPT_GO, REP_ERR_UNSUP) => {
                // Old server: fall back to NBD_OPT_EXPORT_NAME.
                put_u64(&mut self.output, IHAVEOPT);
                put_u32(&mut self.output, OPT_EXPORT_NAME);
                put_u32(&mut self.output, self.config.export_name.len() as u32);
                self.output
                    .extend_from_slice(self.config.export_name.as_bytes());
                self.state = CState::ExportNameReply;
                Ok(None)
            }
            (OPT_LIST, REP_ACK) => Ok(self.next_step(option)),
            (_, t) if t & REP_ERR_BIT != 0 => Err(refused(t, payload)),
            (_, t) => Err(ProtocolError::unexpected(
                "option reply type",
                format!("{t:#x} for option {option}"),
            )),
        }
    }
}

/// Data a successful request returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyData {
    None,
    Read(Vec<u8>),
    /// One list of extents per metadata context id.
    BlockStatus(Vec<(u32, Vec<Extent>)>),
}

/// A finished request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub handle: u64,
    pub result: Result<ReplyData, NbdError>,
}

#[derive(Debug)]
struct Pending {
    command: u16,
    offset: u64,
    length: u32,
    data: Vec<u8>,
    /// Bytes the content chunks so far cover.
    covered: u64,
    /// Those chunks by start offset → end: a chunk overlapping one is refused
    /// (the spec forbids it, and counted twice it hid a gap of zeros).
    chunks: std::collections::BTreeMap<u64, u64>,
    error: Option<NbdError>,
    extents: Vec<(u32, Vec<Extent>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RState {
    Magic,
    SimpleData { handle: u64 },
}

/// Client transmission phase: encode requests, decode (possibly out-of-order,
/// possibly chunked) replies into [`Completion`]s.
#[derive(Debug)]
pub struct ClientSession {
    export: ExportInfo,
    output: Vec<u8>,
    input: InBuf,
    state: RState,
    pending: HashMap<u64, Pending>,
    done: VecDeque<Completion>,
    next_handle: u64,
}

impl ClientSession {
    pub fn new(export: ExportInfo) -> ClientSession {
        ClientSession {
            export,
            output: Vec::new(),
            input: InBuf::default(),
            state: RState::Magic,
            pending: HashMap::new(),
            done: VecDeque::new(),
            next_handle: 1,
        }
    }
    pub fn export(&self) -> &ExportInfo {
        &self.export
    }
    pub fn output(&self) -> &[u8] {
        &self.output
    }
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }
    /// Requests sent and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Sends any request (also invalid ones, for tests); returns its handle.
    /// For `NBD_CMD_WRITE`, `payload` must hold `length` bytes.
    pub fn send_raw(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        let header = RequestHeader {
            flags,
            command,
            handle,
            offset,
            length,
        };
        self.output.extend_from_slice(&header.encode());
        self.output.extend_from_slice(payload);
        if command != CMD_DISC {
            self.pending.insert(
                handle,
                Pending {
                    command,
                    offset,
                    length,
                    data: Vec::new(),
                    covered: 0,
                    chunks: Default::default(),
                    error: None,
                    extents: vec![],
                },
            );
        }
        handle
    }
    pub fn read(&mut self, offset: u64, length: u32) -> u64 {
        self.send_raw(CMD_READ, 0, offset, length, &[])
    }
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> u64 {
        self.send_raw(
            CMD_WRITE,
            if fua { CMD_FLAG_FUA } else { 0 },
            offset,
            data.len() as u32,
            data,
        )
    }
    pub fn flush(&mut self) -> u64 {
        self.send_raw(CMD_FLUSH, 0, 0, 0, &[])
    }
    pub fn trim(&mut self, offset: u64, length: u32) -> u64 {
        self.send_raw(CMD_TRIM, 0, offset, length, &[])
    }
    pub fn write_zeroes(&mut self, offset: u64, length: u32, no_hole: bool) -> u64 {
        self.send_raw(
            CMD_WRITE_ZEROES,
            if no_hole { CMD_FLAG_NO_HOLE } else { 0 },
            offset,
            length,
            &[],
        )
    }
    pub fn cache(&mut self, offset: u64, length: u32) -> u64 {
        self.send_raw(CMD_CACHE, 0, offset, length, &[])
    }
    pub fn block_status(&mut self, offset: u64, length: u32, req_one: bool) -> u64 {
        self.send_raw(
            CMD_BLOCK_STATUS,
            if req_one { CMD_FLAG_REQ_ONE } else { 0 },
            offset,
            length,
            &[],
        )
    }
    /// Soft disconnect; nothing may be sent after it.
    pub fn disconnect(&mut self) {
        self.send_raw(CMD_DISC, 0, 0, 0, &[]);
    }

    /// Next finished request, in the order replies completed.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.done.pop_front()
    }

    /// Feeds bytes from the server. `Err`: the stream is broken, close it.
    pub fn input(&mut self, data: &[u8]) -> Result<(), ProtocolError> {
        self.input.extend(data);
        loop {
            match self.state {
                RState::Magic => {
                    let Some(magic) = Reader::new(self.input.as_slice()).u32() else {
                        return Ok(());
                    };
                    let progressed = match magic {
                        SIMPLE_REPLY_MAGIC => self.simple_header()?,
                        STRUCTURED_REPLY_MAGIC => self.structured_chunk()?,
                        other => {
                            return Err(ProtocolError::BadMagic {
                                expected: SIMPLE_REPLY_MAGIC as u64,
                                got: other as u64,
                            });
                        }
                    };
                    if !progressed {
                        return Ok(());
                    }
                }
                RState::SimpleData { handle } => {
                    let len = self.pending.get(&handle).map_or(0, |p| p.length as usize);
                    if self.input.len() < len {
                        return Ok(());
                    }
                    let data = self.input.as_slice()[..len].to_vec();
                    self.input.consume(len);
                    self.pending.remove(&handle);
                    self.done.push_back(Completion {
                        handle,
                        result: Ok(ReplyData::Read(data)),
                    });
                    self.state = RState::Magic;
                }
            }
        }
    }

    fn simple_header(&mut self) -> Result<bool, ProtocolError> {
        let mut r = Reader::new(self.input.as_slice());
        let (Some(_), Some(error), Some(handle)) = (r.u32(), r.u32(), r.u64()) else {
            return Ok(false);
        };
        self.input.consume(SIMPLE_REPLY_LEN);
        let Some(p) = self.pending.get(&handle) else {
            return Err(ProtocolError::unexpected(
                "simple reply",
                format!("unknown handle {handle}"),
            ));
        };
        if let Some(code) = ErrorCode::from_wire(error) {
            self.pending.remove(&handle);
            self.done.push_back(Completion {
                handle,
                result: Err(NbdError::new(code, "")),
            });
        } else if p.command == CMD_READ {
            self.state = RState::SimpleData { handle };
        } else if p.command == CMD_BLOCK_STATUS {
            return Err(ProtocolError::unexpected(
                "simple reply",
                "to NBD_CMD_BLOCK_STATUS",
            ));
        } else {
            self.pending.remove(&handle);
            self.done.push_back(Completion {
                handle,
                result: Ok(ReplyData::None),
            });
        }
        Ok(true)
    }

    fn structured_chunk(&mut self) -> Result<bool, ProtocolError> {
        let mut r = Reader::new(self.input.as_slice());
        let (Some(_), Some(flags), Some(kind), Some(handle), Some(len)) =
            (r.u32(), r.u16(), r.u16(), r.u64(), r.u32())
        else {
            return Ok(false);
        };
        let len = len as usize;
        let limit = self
            .export
            .block_size
            .max_payload_bytes
            .min(DEFAULT_MAX_PAYLOAD) as usize
            + 64 * 1024;
        if len > limit {
            return Err(ProtocolError::unexpected(
                "structured reply",
                format!("chunk of {len} bytes"),
            ));
        }
        if self.input.len() < CHUNK_HEADER_LEN + len {
            return Ok(false);
        }
        // Borrowed in place (no copy of READ data beyond the one into the result).
        let payload = &self.input.as_slice()[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + len];
        let Some(p) = self.pending.get_mut(&handle) else {
            return Err(ProtocolError::unexpected(
                "structured reply",
                format!("unknown handle {handle}"),
            ));
        };
        let bad =
            |detail: &str| ProtocolError::unexpected("structured reply chunk", detail.to_string());
        let mut r = Reader::new(payload);
        match kind {
            REPLY_TYPE_NONE => {
                if len != 0 || flags & REPLY_FLAG_DONE == 0 {
                    return Err(bad("NBD_REPLY_TYPE_NONE must be empty and final"));
                }
            }
            REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                if p.command != CMD_READ {
                    return Err(bad("content chunk for a request that is not a read"));
                }
                let offset = r.u64().ok_or_else(|| bad("short content chunk"))?;
                let (n, data) = if kind == REPLY_TYPE_OFFSET_DATA {
                    let d = r.rest();
                    (d.len() as u64, Some(d))
                } else {
                    if len != 12 {
                        return Err(bad("NBD_REPLY_TYPE_OFFSET_HOLE length must be 12"));
                    }
                    (r.u32().unwrap_or_default() as u64, None)
                };
                let end = p.offset + p.length as u64;
                if n == 0 || offset < p.offset || offset.checked_add(n).is_none_or(|e| e > end) {
                    return Err(bad("content chunk outside the request"));
                }
                if p.data.len() != p.length as usize {
                    p.data = vec![0u8; p.length as usize];
                }
                let (start, stop) = (offset, offset + n);
                let before = p.chunks.range(..=start).next_back();
                let after = p.chunks.range(start..).next();
                if before.is_some_and(|(_, &e)| e > start) || after.is_some_and(|(&b, _)| b < stop)
                {
                    return Err(bad("content chunks overlap"));
                }
                p.chunks.insert(start, stop);
                let at = (offset - p.offset) as usize;
                match data {
                    Some(d) => p.data[at..at + d.len()].copy_from_slice(d),
                    None => p.data[at..at + n as usize].fill(0),
                }
                p.covered += n;
            }
            REPLY_TYPE_BLOCK_STATUS => {
                if p.command != CMD_BLOCK_STATUS || len < 12 || !(len - 4).is_multiple_of(8) {
                    return Err(bad("malformed NBD_REPLY_TYPE_BLOCK_STATUS"));
                }
                let id = r.u32().unwrap_or_default();
                let mut extents = Vec::with_capacity((len - 4) / 8);
                while let (Some(length), Some(flags)) = (r.u32(), r.u32()) {
                    if length == 0 {
                        return Err(bad("zero-length extent"));
                    }
                    extents.push(Extent { length, flags });
                }
                p.extents.push((id, extents));
            }
            k if k & REPLY_TYPE_ERROR_BIT != 0 => {
                let code = r.u32().ok_or_else(|| bad("short error chunk"))?;
                let msg_len = r.u16().ok_or_else(|| bad("short error chunk"))? as usize;
                let msg = r
                    .bytes(msg_len)
                    .ok_or_else(|| bad("error message longer than the chunk"))?;
                let code = ErrorCode::from_wire(code).unwrap_or(ErrorCode::Inval);
                p.error.get_or_insert(NbdError::new(
                    code,
                    String::from_utf8_lossy(msg).into_owned(),
                ));
            }
            other => return Err(bad(&format!("unknown chunk type {other}"))),
        }
        self.input.consume(CHUNK_HEADER_LEN + len);
        if flags & REPLY_FLAG_DONE != 0 {
            let Some(p) = self.pending.remove(&handle) else {
                return Err(bad("reply for a finished request"));
            };
            let result = match p.error {
                Some(e) => Err(e),
                None if p.command == CMD_READ => {
                    if p.covered != p.length as u64 {
                        return Err(bad("read reply does not cover the request"));
                    }
                    let mut data = p.data;
                    data.resize(p.length as usize, 0);
                    Ok(ReplyData::Read(data))
                }
                None if p.command == CMD_BLOCK_STATUS => {
                    if p.extents.is_empty() {
                        return Err(bad("block status reply without descriptors"));
                    }
                    Ok(ReplyData::BlockStatus(p.extents))
                }
                None => Ok(ReplyData::None),
            };
            self.done.push_back(Completion { handle, result });
        }
        Ok(true)
    }
}
