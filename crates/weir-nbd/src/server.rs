//! Server side of the fixed newstyle handshake, as a sans-I/O state machine.
//!
//! ```text
//! let mut hs = ServerHandshake::new();
//! socket.write_all(&hs.take_output());            // greeting
//! loop {
//!     // Options still buffered (the output reached MAX_OUTPUT) come first.
//!     let n = if hs.has_buffered_options() { 0 } else { socket.read(&mut buf)? };
//!     // (n == 0 from a read: the client went away)
//!     let event = hs.input(&buf[..n], &catalog)?; // Err: close this connection
//!     socket.write_all(&hs.take_output());
//!     match event {
//!         Some(HandshakeEvent::ExportChosen(info)) => break, // transmission; hs.take_leftover()
//!         Some(HandshakeEvent::Aborted) => return,          // client soft-disconnected
//!         Some(HandshakeEvent::StartTls) => {               // ACK sent: TLS from here on
//!             socket = tls_accept(socket)?;                 // server side of the TLS handshake
//!             hs.tls_started();
//!         }
//!         None => {}
//!     }
//! }
//! ```
//!
//! TLS ([`TlsPolicy`], `doc/proto.md` "TLS support"): `Off` is the spec's NOTLS
//! mode (`NBD_OPT_STARTTLS` gets `NBD_REP_ERR_UNSUP`); `Optional` offers
//! STARTTLS and serves every option either way (SELECTIVETLS with no TLS-only
//! export: the catalog decides what a client sees, e.g. by its certificate);
//! `Required` is FORCEDTLS: before STARTTLS every option but STARTTLS and ABORT
//! gets `NBD_REP_ERR_TLS_REQD` (nothing about exports is revealed) and
//! `NBD_OPT_EXPORT_NAME` closes the connection.

use crate::consts::*;
use crate::error::ProtocolError;
use crate::export::{ExportCatalog, ExportDescription, ExportInfo};
use crate::wire::{InBuf, Reader, parse_string, put_u16, put_u32, put_u64};

/// Something the caller must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeEvent {
    /// Option haggling ended (`NBD_OPT_GO` acknowledged or `NBD_OPT_EXPORT_NAME`
    /// answered): send the pending output, then enter transmission.
    ExportChosen(ExportInfo),
    /// The client sent `NBD_OPT_ABORT`; the ACK is in the output; close after it.
    Aborted,
    /// The client sent `NBD_OPT_STARTTLS` and the ACK is in the output: send it,
    /// run the server side of a TLS handshake on the connection, then call
    /// [`ServerHandshake::tls_started`] and go on feeding (decrypted) input.
    StartTls,
}

/// Whether the server offers or insists on TLS (see the module documentation).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsPolicy {
    /// NOTLS: `NBD_OPT_STARTTLS` is refused.
    #[default]
    Off,
    /// TLS at the client's choice.
    Optional,
    /// FORCEDTLS: no option but STARTTLS and ABORT before TLS.
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData {
        option: u32,
        len: u32,
    },
    /// STARTTLS acknowledged: no input until [`ServerHandshake::tls_started`].
    AwaitingTls,
    Finished,
}

/// `text` as it may go to a client: control characters (which a terminal showing
/// `nbdinfo --list` would interpret) replaced by U+FFFD, and at most
/// [`MAX_STRING_LEN`] bytes (cut at a character boundary), as `proto.md` bounds
/// strings.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let clean = !text.chars().any(char::is_control) && text.len() <= MAX_STRING_LEN;
    if clean {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(MAX_STRING_LEN));
    for c in text.chars() {
        let c = if c.is_control() { '\u{FFFD}' } else { c };
        if out.len() + c.len_utf8() > MAX_STRING_LEN {
            break;
        }
        out.push(c);
    }
    std::borrow::Cow::Owned(out)
}

/// Context id given to `base:allocation` by `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// Context id given to a granted `weir:exclusive=TOKEN` lease.
pub const LEASE_CONTEXT_ID: u32 = 2;

/// Whether `token` may name a lease: 1 to [`MAX_LEASE_TOKEN_LEN`] ASCII letters,
/// digits, `-` or `_`.
pub fn valid_lease_token(token: &str) -> bool {
    (1..=MAX_LEASE_TOKEN_LEN).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// What the last `NBD_OPT_SET_META_CONTEXT` selected.
#[derive(Debug, Default, Clone)]
struct MetaSelection {
    /// The export it referred to.
    export: String,
    allocation: bool,
    /// A `weir:exclusive=TOKEN` lease the catalog agreed to grant.
    lease: Option<String>,
}

/// Server handshake: feed client bytes with [`ServerHandshake::input`], send what
/// [`ServerHandshake::take_output`] returns.
#[derive(Debug)]
pub struct ServerHandshake {
    state: State,
    input: InBuf,
    output: Vec<u8>,
    no_zeroes: bool,
    structured: bool,
    /// What the last SET_META_CONTEXT selected, if anything.
    meta: Option<MetaSelection>,
    shutting_down: bool,
    /// Set by [`ServerHandshake::refuse`]: why every option is refused.
    refusal: Option<String>,
    options_seen: u32,
    tls: TlsPolicy,
    /// The client set `NBD_FLAG_C_FIXED_NEWSTYLE` (TLS needs it).
    fixed: bool,
    tls_active: bool,
    /// [`ServerHandshake::input`] stopped with whole options still buffered:
    /// the output reached [`ServerHandshake::MAX_OUTPUT`].
    paused: bool,
}

impl Default for ServerHandshake {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerHandshake {
    /// Most options one connection may send before it is deemed abusive.
    pub const MAX_OPTIONS: u32 = 4096;
    /// Replies [`ServerHandshake::input`] produces before it stops answering
    /// buffered options (a client pipelining a thousand `NBD_OPT_LIST`s in one
    /// read, and reading nothing, would otherwise make the server hold a
    /// thousand copies of the export list).
    pub const MAX_OUTPUT: usize = 64 * 1024;

    /// A new connection; the greeting is already in the output.
    pub fn new() -> ServerHandshake {
        let mut output = Vec::with_capacity(18);
        put_u64(&mut output, NBDMAGIC);
        put_u64(&mut output, IHAVEOPT);
        put_u16(&mut output, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        ServerHandshake {
            state: State::ClientFlags,
            input: InBuf::default(),
            output,
            no_zeroes: false,
            structured: false,
            meta: None,
            shutting_down: false,
            refusal: None,
            options_seen: 0,
            tls: TlsPolicy::Off,
            fixed: false,
            tls_active: false,
            paused: false,
        }
    }

    /// A new connection under `policy` (the greeting is the same either way).
    pub fn with_tls(policy: TlsPolicy) -> ServerHandshake {
        ServerHandshake {
            tls: policy,
            ..ServerHandshake::new()
        }
    }

    /// The TLS handshake that followed [`HandshakeEvent::StartTls`] succeeded:
    /// option haggling goes on over TLS. What was negotiated before (structured
    /// replies, the meta context) is forgotten: it was not protected.
    pub fn tls_started(&mut self) {
        if self.state == State::AwaitingTls {
            self.state = State::OptionHeader;
            self.tls_active = true;
            self.structured = false;
            self.meta = None;
        }
    }

    /// Whether option haggling runs over TLS.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// Bytes to send to the client.
    pub fn output(&self) -> &[u8] {
        &self.output
    }
    /// Takes the bytes to send to the client.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }
    /// Bytes received after the option that ended the handshake (already the
    /// start of the transmission phase).
    pub fn take_leftover(&mut self) -> Vec<u8> {
        self.input.take_all()
    }
    /// From now on every option but `NBD_OPT_ABORT` is refused with
    /// `NBD_REP_ERR_SHUTDOWN`.
    pub fn begin_shutdown(&mut self) {
        self.shutting_down = true;
    }
    /// From now on every option but `NBD_OPT_ABORT` is refused with
    /// `NBD_REP_ERR_POLICY` and `reason` (`NBD_OPT_EXPORT_NAME`, which cannot be
    /// answered with an error, ends the handshake): how a server turns away a
    /// client it will not serve (too many connections) so that the client can
    /// say why.
    pub fn refuse(&mut self, reason: impl Into<String>) {
        self.refusal = Some(reason.into());
    }
    pub fn is_finished(&self) -> bool {
        self.state == State::Finished
    }

    /// Whether the last [`ServerHandshake::input`] stopped at
    /// [`ServerHandshake::MAX_OUTPUT`] with options still buffered: send the
    /// output, then call `input(&[])` (before reading more from the client).
    pub fn has_buffered_options(&self) -> bool {
        self.paused
    }

    /// Feeds bytes from the client. `Err` means: close the connection (after
    /// sending any pending output). Stops early, with the rest buffered, once
    /// the output holds [`ServerHandshake::MAX_OUTPUT`] bytes (see
    /// [`ServerHandshake::has_buffered_options`]).
    pub fn input(
        &mut self,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Result<Option<HandshakeEvent>, ProtocolError> {
        if self.state == State::Finished {
            return Err(ProtocolError::Finished);
        }
        if self.state == State::AwaitingTls {
            self.state = State::Finished;
            return Err(ProtocolError::client_sent(
                "input",
                "plain-text data after NBD_OPT_STARTTLS was acknowledged",
            ));
        }
        self.input.extend(data);
        self.paused = false;
        loop {
            match self.state {
                State::Finished => return Ok(None),
                State::AwaitingTls => {
                    if !self.input.is_empty() {
                        self.state = State::Finished;
                        return Err(ProtocolError::client_sent(
                            "input",
                            "the client sent data before the server acknowledged NBD_OPT_STARTTLS",
                        ));
                    }
                    return Ok(Some(HandshakeEvent::StartTls));
                }
                State::ClientFlags => {
                    let Some(flags) = Reader::new(self.input.as_slice()).u32() else {
                        return Ok(None);
                    };
                    self.input.consume(4);
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        self.state = State::Finished;
                        return Err(ProtocolError::BadClientFlags(flags));
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.fixed = flags & FLAG_C_FIXED_NEWSTYLE != 0;
                    self.state = State::OptionHeader;
                }
                State::OptionHeader => {
                    if self.output.len() >= Self::MAX_OUTPUT {
                        self.paused = !self.input.is_empty();
                        return Ok(None);
                    }
                    let mut r = Reader::new(self.input.as_slice());
                    let (Some(magic), Some(option), Some(len)) = (r.u64(), r.u32(), r.u32()) else {
                        return Ok(None);
                    };
                    self.input.consume(16);
                    if magic != IHAVEOPT {
                        self.state = State::Finished;
                        return Err(ProtocolError::BadMagic {
                            expected: IHAVEOPT,
                            got: magic,
                        });
                    }
                    self.options_seen += 1;
                    if self.options_seen > Self::MAX_OPTIONS {
                        self.state = State::Finished;
                        return Err(ProtocolError::client_sent(
                            "option count",
                            "more than 4096 options",
                        ));
                    }
                    if len > MAX_OPTION_LEN {
                        self.state = State::Finished;
                        return self.oversized_option(option, len);
                    }
                    self.state = State::OptionData { option, len };
                }
                State::OptionData { option, len } => {
                    if self.input.len() < len as usize {
                        return Ok(None);
                    }
                    let data = self.input.as_slice()[..len as usize].to_vec();
                    self.input.consume(len as usize);
                    self.state = State::OptionHeader;
                    match self.handle_option(option, &data, catalog)? {
                        Some(HandshakeEvent::StartTls) => self.state = State::AwaitingTls,
                        Some(event) => {
                            self.state = State::Finished;
                            return Ok(Some(event));
                        }
                        None => {}
                    }
                }
            }
        }
    }

    /// An option declaring more data than [`MAX_OPTION_LEN`]: refused at once
    /// (`NBD_REP_ERR_TOO_BIG`, then the connection closes) instead of reading and
    /// discarding what may be gigabytes; an `NBD_OPT_ABORT` is still honoured.
    fn oversized_option(
        &mut self,
        option: u32,
        len: u32,
    ) -> Result<Option<HandshakeEvent>, ProtocolError> {
        match option {
            OPT_ABORT => {
                self.reply(option, REP_ACK, &[]);
                Ok(Some(HandshakeEvent::Aborted))
            }
            OPT_EXPORT_NAME => Err(ProtocolError::ExportNameTooLong(len)),
            _ => {
                let message = format!("option data of {len} bytes exceeds {MAX_OPTION_LEN}");
                self.reply_err(option, REP_ERR_TOO_BIG, &message);
                Err(ProtocolError::client_sent("option length", message))
            }
        }
    }

    fn reply(&mut self, option: u32, reply_type: u32, data: &[u8]) {
        put_u64(&mut self.output, REPLY_MAGIC);
        put_u32(&mut self.output, option);
        put_u32(&mut self.output, reply_type);
        put_u32(&mut self.output, data.len() as u32);
        self.output.extend_from_slice(data);
    }

    fn reply_err(&mut self, option: u32, reply_type: u32, message: &str) {
        self.reply(option, reply_type, message.as_bytes());
    }

    /// FORCEDTLS before the upgrade.
    fn tls_required(&self) -> bool {
        self.tls == TlsPolicy::Required && !self.tls_active
    }

    fn reply_tls_required(&mut self, option: u32) {
        self.reply_err(
            option,
            REP_ERR_TLS_REQD,
            "this server requires TLS: send NBD_OPT_STARTTLS first",
        );
    }

    fn handle_option(
        &mut self,
        option: u32,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Result<Option<HandshakeEvent>, ProtocolError> {
        if option == OPT_ABORT {
            // Data, if any, is ignored as the spec asks.
            self.reply(option, REP_ACK, &[]);
            return Ok(Some(HandshakeEvent::Aborted));
        }
        if self.shutting_down {
            if option == OPT_EXPORT_NAME {
                return Err(ProtocolError::client_sent(
                    "option",
                    "server is shutting down",
                ));
            }
            self.reply_err(option, REP_ERR_SHUTDOWN, "server is shutting down");
            return Ok(None);
        }
        if let Some(reason) = self.refusal.clone() {
            if option == OPT_EXPORT_NAME {
                return Err(ProtocolError::client_sent("option", reason));
            }
            self.reply_err(option, REP_ERR_POLICY, &reason);
            return Ok(None);
        }
        if option == OPT_STARTTLS {
            return Ok(self.handle_starttls(data));
        }
        if self.tls_required() {
            if option == OPT_EXPORT_NAME {
                // It cannot be refused with an error reply.
                return Err(ProtocolError::client_sent(
                    "option",
                    "NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS on a server that requires TLS",
                ));
            }
            self.reply_tls_required(option);
            return Ok(None);
        }
        match option {
            OPT_EXPORT_NAME => {
                let name =
                    parse_string(data).map_err(|e| ProtocolError::client_sent("export name", e))?;
                let Some(export) = catalog.lookup(&name) else {
                    return Err(ProtocolError::UnknownExport(name));
                };
                let info = self.export_info(&name, &export);
                put_u64(&mut self.output, info.size_bytes);
                put_u16(&mut self.output, info.transmission_flags);
                if !self.no_zeroes {
                    self.output.extend_from_slice(&[0u8; 124]);
                }
                Ok(Some(HandshakeEvent::ExportChosen(info)))
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.reply_err(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
                    return Ok(None);
                }
                for export in catalog.list() {
                    let mut d =
                        Vec::with_capacity(4 + export.name.len() + export.description.len());
                    put_u32(&mut d, export.name.len() as u32);
                    d.extend_from_slice(export.name.as_bytes());
                    d.extend_from_slice(printable(&export.description).as_bytes());
                    self.reply(option, REP_SERVER, &d);
                }
                self.reply(option, REP_ACK, &[]);
                Ok(None)
            }
            OPT_INFO | OPT_GO => self.handle_info_go(option, data, catalog),
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.reply_err(
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                    return Ok(None);
                }
                self.structured = true;
                self.reply(option, REP_ACK, &[]);
                Ok(None)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.handle_meta_context(option, data, catalog);
                Ok(None)
            }
            _ => {
                self.reply_err(option, REP_ERR_UNSUP, "option not supported");
                Ok(None)
            }
        }
    }

    fn handle_starttls(&mut self, data: &[u8]) -> Option<HandshakeEvent> {
        let option = OPT_STARTTLS;
        if self.tls == TlsPolicy::Off || !self.fixed {
            self.reply_err(option, REP_ERR_UNSUP, "TLS is not enabled on this server");
            None
        } else if self.tls_active {
            self.reply_err(option, REP_ERR_INVALID, "TLS is already active");
            None
        } else if !data.is_empty() {
            self.reply_err(option, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
            None
        } else {
            self.reply(option, REP_ACK, &[]);
            Some(HandshakeEvent::StartTls)
        }
    }

    fn export_info(&self, requested_name: &str, export: &ExportDescription) -> ExportInfo {
        let selected = self
            .meta
            .as_ref()
            .filter(|m| self.structured && (m.export == requested_name || m.export == export.name));
        let base_allocation_id = selected
            .filter(|m| m.allocation)
            .map(|_| BASE_ALLOCATION_ID);
        let exclusive_lease = selected.and_then(|m| m.lease.clone());
        ExportInfo {
            name: export.name.clone(),
            size_bytes: export.size_bytes,
            transmission_flags: export.transmission_flags(self.structured),
            structured_replies: self.structured,
            base_allocation_id,
            block_size: export.block_size,
            exclusive_lease,
        }
    }

    fn handle_info_go(
        &mut self,
        option: u32,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Result<Option<HandshakeEvent>, ProtocolError> {
        let mut r = Reader::new(data);
        let parsed = (|| {
            let name_len = r.u32()? as usize;
            if name_len + 6 > data.len() {
                return None;
            }
            let name = r.bytes(name_len)?;
            let count = r.u16()? as usize;
            if r.remaining() != count * 2 {
                return None;
            }
            let mut requests = Vec::with_capacity(count);
            for _ in 0..count {
                requests.push(r.u16()?);
            }
            Some((name, requests))
        })();
        let Some((name_bytes, requests)) = parsed else {
            self.reply_err(
                option,
                REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/NBD_OPT_GO data",
            );
            return Ok(None);
        };
        let name = match parse_string(name_bytes) {
            Ok(n) => n,
            Err(e) => {
                self.reply_err(option, REP_ERR_INVALID, e);
                return Ok(None);
            }
        };
        let Some(export) = catalog.lookup(&name) else {
            self.reply_err(
                option,
                REP_ERR_UNKNOWN,
                &format!("export {name:?} is not available"),
            );
            return Ok(None);
        };
        let info = self.export_info(&name, &export);
        let mut d = Vec::with_capacity(12);
        put_u16(&mut d, INFO_EXPORT);
        put_u64(&mut d, info.size_bytes);
        put_u16(&mut d, info.transmission_flags);
        self.reply(option, REP_INFO, &d);
        if requests.contains(&INFO_NAME) {
            let mut d = Vec::new();
            put_u16(&mut d, INFO_NAME);
            d.extend_from_slice(export.name.as_bytes());
            self.reply(option, REP_INFO, &d);
        }
        if requests.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
            let mut d = Vec::new();
            put_u16(&mut d, INFO_DESCRIPTION);
            d.extend_from_slice(printable(&export.description).as_bytes());
            self.reply(option, REP_INFO, &d);
        }
        // Always advertised (never required of the client: no BLOCK_SIZE_REQD).
        let mut d = Vec::with_capacity(14);
        put_u16(&mut d, INFO_BLOCK_SIZE);
        put_u32(&mut d, export.block_size.min_bytes);
        put_u32(&mut d, export.block_size.preferred_bytes);
        put_u32(&mut d, export.block_size.max_payload_bytes);
        self.reply(option, REP_INFO, &d);
        self.reply(option, REP_ACK, &[]);
        if option == OPT_GO {
            Ok(Some(HandshakeEvent::ExportChosen(info)))
        } else {
            Ok(None)
        }
    }

    fn handle_meta_context(&mut self, option: u32, data: &[u8], catalog: &dyn ExportCatalog) {
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            // Replaces the previous selection, even when this request fails.
            self.meta = None;
        }
        if !self.structured {
            self.reply_err(
                option,
                REP_ERR_INVALID,
                "negotiate NBD_OPT_STRUCTURED_REPLY first",
            );
            return;
        }
        let mut r = Reader::new(data);
        let parsed = (|| {
            let name_len = r.u32()? as usize;
            let name = r.bytes(name_len)?;
            let count = r.u32()?;
            let mut queries = Vec::new();
            for _ in 0..count {
                let len = r.u32()? as usize;
                queries.push(r.bytes(len)?);
            }
            if r.remaining() != 0 {
                return None;
            }
            Some((name, queries))
        })();
        let Some((name_bytes, queries)) = parsed else {
            self.reply_err(option, REP_ERR_INVALID, "malformed meta context request");
            return;
        };
        let name = match parse_string(name_bytes) {
            Ok(n) => n,
            Err(e) => {
                self.reply_err(option, REP_ERR_INVALID, e);
                return;
            }
        };
        let mut allocation = queries.is_empty() && !set;
        let mut lease = None;
        for q in &queries {
            let q = match parse_string(q) {
                Ok(q) => q,
                Err(e) => {
                    self.reply_err(option, REP_ERR_INVALID, e);
                    return;
                }
            };
            let Some((namespace, leaf)) = q.split_once(':') else {
                self.reply_err(
                    option,
                    REP_ERR_INVALID,
                    &format!("query {q:?} has no namespace"),
                );
                return;
            };
            if namespace == "base" && (leaf == "allocation" || (leaf.is_empty() && !set)) {
                allocation = true;
            }
            if let Some(token) = q.strip_prefix(WEIR_EXCLUSIVE_PREFIX)
                && set
                && valid_lease_token(token)
            {
                lease = Some(token.to_string());
            }
        }
        if catalog.lookup(&name).is_none() {
            self.reply_err(
                option,
                REP_ERR_UNKNOWN,
                &format!("export {name:?} is not available"),
            );
            return;
        }
        if allocation {
            let mut d = Vec::new();
            put_u32(&mut d, if set { BASE_ALLOCATION_ID } else { 0 });
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &d);
        }
        // Only a SET asks for a lease; the catalog says whether it would be
        // granted (the server takes it when transmission starts).
        let lease = lease.filter(|t| catalog.lease_available(&name, t));
        if let Some(token) = &lease {
            let mut d = Vec::new();
            put_u32(&mut d, LEASE_CONTEXT_ID);
            d.extend_from_slice(WEIR_EXCLUSIVE_PREFIX.as_bytes());
            d.extend_from_slice(token.as_bytes());
            self.reply(option, REP_META_CONTEXT, &d);
        }
        if set && (allocation || lease.is_some()) {
            self.meta = Some(MetaSelection {
                export: name,
                allocation,
                lease,
            });
        }
        self.reply(option, REP_ACK, &[]);
    }
}
