//! The server side of the fixed-newstyle handshake as a state machine without I/O.
//!
//! The caller sends `greeting()`, then repeatedly reads exactly the number of bytes that
//! `Next::Read` asks for, passes them to `input`, and writes whatever `input` appended to the
//! output buffer. The machine ends in `Next::Transmission` or `Next::Close`.

use crate::limits::*;
use crate::reply::truncate_utf8;
use crate::wire::*;

/// What the server knows about one export, as the handshake reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSummary {
    pub size: u64,
    /// Transmission flags except SEND_DF, which depends on structured replies and is added
    /// by the handshake.
    pub flags: u16,
    pub description: Option<String>,
    pub block_min: u32,
    pub block_preferred: u32,
    pub block_max: u32,
    /// What the export is, as something stable that changes when the data behind the name
    /// does (another file, a RAM disk started afresh): `LIST_META_CONTEXT` names it as
    /// `x-sluice:identity:TEXT` when asked for it, so that a client reconnecting after a restart can tell the
    /// same disk from a different one under the same name.
    pub identity: Option<String>,
}

/// The exports a server offers. The handshake only looks names up and lists them.
pub trait Catalog {
    fn lookup(&self, name: &str) -> Option<ExportSummary>;
    /// Names and descriptions of every export, for NBD_OPT_LIST.
    fn list(&self) -> Vec<(String, Option<String>)>;
}

/// What the client and server agreed on; transmission starts with this.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub export: String,
    pub summary: ExportSummary,
    /// Flags as sent to the client, SEND_DF included when it applies.
    pub flags: u16,
    pub structured: bool,
    /// Extended headers were negotiated; `structured` is then true as well.
    pub extended: bool,
    pub base_allocation: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Read exactly this many bytes and pass them to `input`.
    Read(usize),
    /// Flush the output; the connection is in transmission.
    Transmission(Box<Negotiated>),
    /// Flush the output and close the connection; `reason` is for the log.
    Close { reason: String },
    /// Flush the output (the STARTTLS acknowledgement), then run the TLS handshake as the
    /// server over the same socket; once it succeeds, call `tls_started` and read what it
    /// asks for over TLS. If it fails, close the connection: the client was told TLS is
    /// coming, so there is no going back to plaintext.
    StartTls,
}

/// Whether the server offers TLS (doc/proto.md, "TLS support").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// NOTLS: STARTTLS is refused with ERR_POLICY.
    #[default]
    Off,
    /// TLS at the client's choice: every option works in plaintext, and STARTTLS upgrades
    /// (SELECTIVETLS with no TLS-only export).
    On,
    /// FORCEDTLS: every option but STARTTLS and ABORT is refused with ERR_TLS_REQD until
    /// TLS is running, and EXPORT_NAME before it ends the connection.
    Require,
}

/// Context id of base:allocation: the only context, so any fixed number serves.
pub const BASE_ALLOCATION_ID: u32 = 1;

#[derive(Clone, Debug)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData { option: u32 },
    Finished,
}

#[derive(Debug)]
pub struct Handshake {
    state: State,
    tls: TlsMode,
    /// TLS is running: a second STARTTLS is refused, nothing is refused for want of TLS.
    tls_active: bool,
    no_zeroes: bool,
    structured: bool,
    extended: bool,
    /// Export named by the last SET_META_CONTEXT and whether it selected base:allocation.
    meta: Option<(String, bool)>,
    options_seen: u32,
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

impl Handshake {
    pub fn new() -> Handshake {
        Handshake::with_tls(TlsMode::Off)
    }

    pub fn with_tls(tls: TlsMode) -> Handshake {
        Handshake {
            state: State::ClientFlags,
            tls,
            tls_active: false,
            no_zeroes: false,
            structured: false,
            extended: false,
            meta: None,
            options_seen: 0,
        }
    }

    /// The TLS handshake that `Next::StartTls` asked for succeeded. Whatever the client
    /// negotiated in plaintext is forgotten (an attacker could have injected it: the
    /// structured-reply injection of CVE-2021-3716), and the next option is read over TLS.
    pub fn tls_started(&mut self) -> Next {
        self.tls_active = true;
        self.structured = false;
        self.extended = false;
        self.meta = None;
        self.state = State::OptionHeader;
        Next::Read(OPTION_HEADER_BYTES)
    }

    /// Whether TLS is running on this connection.
    pub fn is_tls(&self) -> bool {
        self.tls_active
    }

    /// The server's opening bytes, sent before anything is read.
    pub fn greeting() -> [u8; GREETING_BYTES] {
        let mut b = [0u8; GREETING_BYTES];
        b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        b
    }

    /// What the machine wants first, before any `input`.
    pub fn start() -> Next {
        Next::Read(CLIENT_FLAGS_BYTES)
    }

    /// Feeds exactly the bytes the last `Next::Read` asked for. Replies are appended to `out`.
    pub fn input(&mut self, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) -> Next {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::ClientFlags => self.client_flags(data),
            State::OptionHeader => self.option_header(data, out),
            State::OptionData { option } => self.option(option, data, catalog, out),
            State::Finished => close("input after the handshake finished"),
        }
    }

    fn client_flags(&mut self, data: &[u8]) -> Next {
        let Ok(bytes) = <[u8; 4]>::try_from(data) else { return close("short client flags") };
        let flags = u32::from_be_bytes(bytes);
        if flags & FLAG_C_FIXED_NEWSTYLE == 0 {
            return close("client does not speak fixed newstyle");
        }
        if flags & !CLIENT_FLAGS_KNOWN != 0 {
            return close(format!("unknown client flags {flags:#x}"));
        }
        self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
        self.state = State::OptionHeader;
        Next::Read(OPTION_HEADER_BYTES)
    }

    fn option_header(&mut self, data: &[u8], out: &mut Vec<u8>) -> Next {
        let Ok(b) = <[u8; OPTION_HEADER_BYTES]>::try_from(data) else { return close("short option header") };
        let magic = u64::from_be_bytes(b[0..8].try_into().unwrap());
        let option = u32::from_be_bytes(b[8..12].try_into().unwrap());
        let length = u32::from_be_bytes(b[12..16].try_into().unwrap());
        if magic != IHAVEOPT {
            return close(format!("bad option magic {magic:#x}"));
        }
        self.options_seen += 1;
        if self.options_seen > OPTIONS_PER_HANDSHAKE_MAX {
            option_reply(out, option, REP_ERR_TOO_BIG, b"too many options");
            return close("too many options");
        }
        if length > OPTION_DATA_MAX_BYTES {
            // Reading and discarding up to 4 GiB would let a client pin us; refuse and leave.
            option_reply(out, option, REP_ERR_TOO_BIG, b"option data too large");
            return close(format!("option {option} carries {length} bytes"));
        }
        self.state = State::OptionData { option };
        if length == 0 {
            // Nothing to read: the caller passes an empty slice straight back.
            return Next::Read(0);
        }
        Next::Read(length as usize)
    }

    fn option(&mut self, option: u32, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) -> Next {
        self.state = State::OptionHeader;
        let again = Next::Read(OPTION_HEADER_BYTES);
        if self.tls == TlsMode::Require && !self.tls_active {
            match option {
                OPT_STARTTLS | OPT_ABORT => {}
                OPT_EXPORT_NAME => {
                    // No error reply exists for EXPORT_NAME: the spec says to hang up.
                    self.state = State::Finished;
                    return close("EXPORT_NAME before STARTTLS on a server that requires TLS");
                }
                _ => {
                    // The payload was read in full by now, so the stream stays in step.
                    option_reply(out, option, REP_ERR_TLS_REQD, b"this server requires TLS: send STARTTLS first");
                    return again;
                }
            }
        }
        match option {
            OPT_EXPORT_NAME => return self.export_name(data, catalog, out),
            OPT_ABORT => {
                option_reply(out, option, REP_ACK, &[]);
                self.state = State::Finished;
                return close("client aborted the handshake");
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_reply(out, option, REP_ERR_INVALID, b"LIST takes no data");
                    return again;
                }
                for (name, description) in catalog.list() {
                    let mut payload = Vec::with_capacity(4 + name.len());
                    payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    payload.extend_from_slice(name.as_bytes());
                    if let Some(d) = description {
                        payload.extend_from_slice(d.as_bytes());
                    }
                    option_reply(out, option, REP_SERVER, &payload);
                }
                option_reply(out, option, REP_ACK, &[]);
            }
            OPT_STARTTLS => return self.starttls(data, out),
            OPT_STRUCTURED_REPLY | OPT_EXTENDED_HEADERS => self.reply_style(option, data, out),
            OPT_INFO | OPT_GO => return self.info_or_go(option, data, catalog, out),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(option, data, catalog, out),
            _ => option_reply(out, option, REP_ERR_UNSUP, b"option not supported"),
        }
        again
    }

    /// STRUCTURED_REPLY and EXTENDED_HEADERS (doc/proto.md, "Extended headers"): extended
    /// headers imply structured replies and may follow them; structured replies asked for
    /// after extended headers are refused with EXT_HEADER_REQD, as qemu does.
    fn reply_style(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) {
        let extended = option == OPT_EXTENDED_HEADERS;
        let (kind, msg): (u32, &[u8]) = if !data.is_empty() {
            (REP_ERR_INVALID, b"this option takes no data")
        } else if self.extended && !extended {
            (REP_ERR_EXT_HEADER_REQD, b"extended headers already negotiated")
        } else if self.extended || (self.structured && !extended) {
            (REP_ERR_INVALID, b"already negotiated")
        } else {
            self.structured = true;
            self.extended = extended;
            (REP_ACK, b"")
        };
        option_reply(out, option, kind, msg);
    }

    fn starttls(&mut self, data: &[u8], out: &mut Vec<u8>) -> Next {
        let (kind, msg): (u32, &[u8]) = if !data.is_empty() {
            (REP_ERR_INVALID, b"STARTTLS takes no data")
        } else if self.tls_active {
            (REP_ERR_INVALID, b"TLS is already running")
        } else if self.tls == TlsMode::Off {
            (REP_ERR_POLICY, b"TLS is not enabled on this server")
        } else {
            option_reply(out, OPT_STARTTLS, REP_ACK, &[]);
            // Nothing is read until the TLS handshake has run: any byte the client sent
            // after STARTTLS belongs to TLS, never to the option parser.
            self.state = State::Finished;
            return Next::StartTls;
        };
        option_reply(out, OPT_STARTTLS, kind, msg);
        Next::Read(OPTION_HEADER_BYTES)
    }

    fn export_name(&mut self, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) -> Next {
        // EXPORT_NAME ends the handshake whatever happens, so no later input is parsed.
        self.state = State::Finished;
        if self.extended {
            // The spec forbids it once extended headers are on, and it has no error reply.
            return close("EXPORT_NAME after extended headers were negotiated");
        }
        // No error reply exists for EXPORT_NAME: a bad name ends the connection.
        let Some(name) = string(data) else { return close("export name is not UTF-8 or too long") };
        let Some(summary) = catalog.lookup(name) else { return close(format!("unknown export {name:?}")) };
        let negotiated = self.negotiated(name, summary);
        out.extend_from_slice(&negotiated.summary.size.to_be_bytes());
        out.extend_from_slice(&negotiated.flags.to_be_bytes());
        if !self.no_zeroes {
            out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING_BYTES]);
        }
        Next::Transmission(Box::new(negotiated))
    }

    fn info_or_go(&mut self, option: u32, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) -> Next {
        let again = Next::Read(OPTION_HEADER_BYTES);
        let mut r = Reader(data);
        let parsed = (|| {
            let name = r.string32()?;
            let count = r.u16()?;
            let mut requests = Vec::with_capacity(count as usize);
            for _ in 0..count {
                requests.push(r.u16()?);
            }
            r.end()?;
            Some((name, requests))
        })();
        let Some((name, requests)) = parsed else {
            option_reply(out, option, REP_ERR_INVALID, b"malformed INFO/GO request");
            return again;
        };
        let Some(summary) = catalog.lookup(name) else {
            let msg = format!("export {name:?} not found");
            // The quoted name can be longer than the spec allows any string to be.
            option_reply(out, option, REP_ERR_UNKNOWN, truncate_utf8(&msg, STRING_MAX_BYTES).as_bytes());
            return again;
        };
        let flags = self.flags(&summary);
        let mut export = Vec::with_capacity(12);
        export.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        export.extend_from_slice(&summary.size.to_be_bytes());
        export.extend_from_slice(&flags.to_be_bytes());
        option_reply(out, option, REP_INFO, &export);
        let wants = |info| requests.contains(&info);
        if wants(INFO_NAME) {
            let mut p = INFO_NAME.to_be_bytes().to_vec();
            p.extend_from_slice(name.as_bytes());
            option_reply(out, option, REP_INFO, &p);
        }
        if let (true, Some(d)) = (wants(INFO_DESCRIPTION), summary.description.as_deref()) {
            let mut p = INFO_DESCRIPTION.to_be_bytes().to_vec();
            p.extend_from_slice(d.as_bytes());
            option_reply(out, option, REP_INFO, &p);
        }
        // Always sent: the 32 MiB maximum is stricter than the spec's default, and the spec
        // wants non-default constraints advertised (a client that did not ask ignores it).
        {
            let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
            for v in [summary.block_min, summary.block_preferred, summary.block_max] {
                p.extend_from_slice(&v.to_be_bytes());
            }
            option_reply(out, option, REP_INFO, &p);
        }
        option_reply(out, option, REP_ACK, &[]);
        if option == OPT_INFO {
            return again;
        }
        let name = name.to_owned();
        Next::Transmission(Box::new(self.negotiated(&name, summary)))
    }

    fn meta_context(&mut self, option: u32, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) {
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            // A SET replaces the active contexts even when it fails.
            self.meta = None;
        }
        if set && !self.structured {
            option_reply(out, option, REP_ERR_INVALID, b"SET_META_CONTEXT needs structured replies first");
            return;
        }
        let mut r = Reader(data);
        let parsed = (|| {
            let name = r.string32()?;
            let count = r.u32()?;
            if count > META_QUERIES_MAX {
                return None;
            }
            let mut queries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                queries.push(r.string32()?);
            }
            r.end()?;
            Some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            option_reply(out, option, REP_ERR_INVALID, b"malformed metadata context request");
            return;
        };
        let Some(summary) = catalog.lookup(name) else {
            let msg = format!("export {name:?} not found");
            // The quoted name can be longer than the spec allows any string to be.
            option_reply(out, option, REP_ERR_UNKNOWN, truncate_utf8(&msg, STRING_MAX_BYTES).as_bytes());
            return;
        };
        let selected = if set {
            queries.contains(&META_BASE_ALLOCATION)
        } else {
            // LIST with no queries asks for everything; "base:" asks for the whole namespace.
            queries.is_empty() || queries.iter().any(|q| *q == META_BASE_ALLOCATION || *q == "base:")
        };
        if selected {
            // LIST replies carry id 0: ids mean something only once SET chose them.
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            let mut p = id.to_be_bytes().to_vec();
            p.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
            option_reply(out, option, REP_META_CONTEXT, &p);
        }
        // The identity is only ever listed, and only to a client that names it (or its
        // namespace): it is no context to select, and generic clients need not see it.
        let identity_asked = queries.iter().any(|q| *q == "x-sluice:" || *q == META_SLUICE_IDENTITY);
        if let (false, true, Some(identity)) = (set, identity_asked, &summary.identity) {
            let mut p = 0u32.to_be_bytes().to_vec();
            p.extend_from_slice(format!("{META_SLUICE_IDENTITY}:{identity}").as_bytes());
            option_reply(out, option, REP_META_CONTEXT, &p);
        }
        if set {
            self.meta = Some((name.to_owned(), selected));
        }
        option_reply(out, option, REP_ACK, &[]);
    }

    fn flags(&self, summary: &ExportSummary) -> u16 {
        let mut flags = summary.flags | FLAG_HAS_FLAGS;
        if self.structured {
            flags |= FLAG_SEND_DF;
        } else {
            flags &= !FLAG_SEND_DF;
        }
        flags
    }

    fn negotiated(&mut self, name: &str, summary: ExportSummary) -> Negotiated {
        self.state = State::Finished;
        // Contexts chosen for another export do not carry over to this one.
        let base_allocation = match &self.meta {
            Some((export, true)) if export == name => Some(BASE_ALLOCATION_ID),
            _ => None,
        };
        Negotiated {
            export: name.to_owned(),
            flags: self.flags(&summary),
            summary,
            structured: self.structured,
            extended: self.extended,
            base_allocation,
        }
    }
}

fn close(reason: impl Into<String>) -> Next {
    Next::Close { reason: reason.into() }
}

/// Appends one option reply.
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, payload: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

fn string(data: &[u8]) -> Option<&str> {
    if data.len() > STRING_MAX_BYTES {
        return None;
    }
    std::str::from_utf8(data).ok()
}

/// A bounds-checked cursor over option data.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn string32(&mut self) -> Option<&'a str> {
        let len = self.u32()? as usize;
        string(self.take(len)?)
    }
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}
