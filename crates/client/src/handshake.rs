//! The client side of the fixed-newstyle handshake: greeting, NBD_OPT_STARTTLS first when
//! the URI asks for TLS, structured replies, base:allocation, then NBD_OPT_GO (or
//! NBD_OPT_EXPORT_NAME on servers without GO); and NBD_OPT_LIST / NBD_OPT_INFO for listing
//! exports. `open` does it all under a deadline and starts transmission on the connection
//! it yields.

use crate::connection::Connection;
use crate::error::Error;
use crate::export::Export;
use crate::limits::*;
use crate::options::Options;
use crate::socket::{Reader, Socket, Writer};
use crate::tls;
use crate::uri::{Address, Uri};
use sluice_proto::client as wire_c;
use sluice_proto::client::{Info, OptionReply, OPTION_REPLY_BYTES};
use sluice_proto::wire::*;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One export as NBD_OPT_LIST names it, with its details when NBD_OPT_INFO gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportEntry {
    pub name: String,
    pub description: Option<String>,
    pub details: Option<Export>,
}

/// A connection negotiated for the kernel's nbd driver: simple replies only (the driver
/// knows no other), and the socket whole, with nothing the server sent left unread.
pub(crate) struct ForKernel {
    pub export: Export,
    /// What the server says the export is (`x-sluice:identity:`), when it says.
    pub identity: Option<String>,
    pub socket: Socket,
}

/// Connects to `uri` and negotiates its export for the kernel, within `timeout`.
pub(crate) async fn open_for_kernel(uri: &Uri, timeout: Duration) -> Result<ForKernel, Error> {
    let work = async {
        let (socket, server) = begin(uri, true).await?;
        let (mut r, mut w, lent) = socket.lend();
        let identity = identity(&mut r, &mut w, &uri.export).await.map_err(|e| server.dropped(e))?;
        let n = negotiate(&mut r, &mut w, &server, &uri.export, &KERNEL_OPTIONS).await.map_err(|e| server.dropped(e))?;
        if !r.buffer().is_empty() {
            return Err(Error::Protocol(format!("the server sent {} bytes after NBD_OPT_GO before any request", r.buffer().len())));
        }
        drop((r, w));
        let socket = lent.take().ok_or_else(|| Error::Protocol("the handshake kept its socket".into()))?;
        Ok(ForKernel { export: n.export, identity, socket })
    };
    tokio::time::timeout(timeout, work).await.unwrap_or(Err(Error::Timeout))
}

/// Asks the server what `export` is (NBD_OPT_LIST_META_CONTEXT for `x-sluice:identity`).
/// Servers that are not sluice list nothing, or refuse: no identity, not an error. The
/// spec says a client SHOULD NOT list contexts without structured replies; the kernel's
/// driver reads no structured reply, so this client never negotiates them, and a server
/// that minds refuses the listing, which costs only the identity check.
async fn identity(r: &mut Reader, w: &mut Writer, export: &str) -> Result<Option<String>, Error> {
    let mut out = Vec::new();
    wire_c::meta_context_request(&mut out, OPT_LIST_META_CONTEXT, export, &[META_SLUICE_IDENTITY]);
    send(w, &mut out).await?;
    let mut found = None;
    for _ in 0..OPTION_REPLIES_MAX {
        let (rep, p) = reply(r, OPT_LIST_META_CONTEXT).await?;
        fatal(r, w, &rep, &p).await?;
        match rep.kind {
            REP_META_CONTEXT => {
                let (_, name) = wire_c::decode_meta_context(&p)?;
                if let Some(id) = name.strip_prefix(META_SLUICE_IDENTITY).and_then(|s| s.strip_prefix(':')) {
                    found = Some(id.to_owned());
                }
            }
            REP_ACK => return Ok(found),
            _ if rep.is_error() => return Ok(None),
            k => return Err(Error::Protocol(format!("unexpected reply type {k:#x} to LIST_META_CONTEXT"))),
        }
    }
    Err(Error::Protocol("too many replies to LIST_META_CONTEXT".into()))
}

/// What the handshake settled, beyond the export itself.
/// The kernel's driver reads only simple replies: nothing else is asked for it.
const KERNEL_OPTIONS: Options = Options {
    connections: 1,
    structured: false,
    extended: false,
    block_status: false,
    connect_timeout: std::time::Duration::from_millis(CONNECT_TIMEOUT_MS),
    reconnect: None,
    degraded: false,
};

pub(crate) struct Negotiated {
    pub export: Export,
    pub base_allocation_id: Option<u32>,
}

/// Connects to `uri`, negotiates its export as `options` ask, and starts transmission, all
/// within `timeout`.
pub(crate) async fn open(uri: &Uri, options: &Options, timeout: Duration) -> Result<(Export, Connection), Error> {
    let work = async {
        let (socket, server) = begin(uri, false).await?;
        let (mut r, mut w) = socket.split();
        let n = negotiate(&mut r, &mut w, &server, &uri.export, options).await;
        let n = n.map_err(|e| server.dropped(e))?;
        let conn = Connection::start(r, w, n.export.structured, n.export.extended, n.base_allocation_id);
        Ok((n.export, conn))
    };
    tokio::time::timeout(timeout, work).await.unwrap_or(Err(Error::Timeout))
}

/// What the handshake has settled before option haggling proper: the server's handshake
/// flags, and whether the connection is TLS (version and cipher).
struct Server {
    flags: u16,
    tls: Option<String>,
    /// What a server that closes the connection just after the TLS handshake most likely
    /// means by it.
    dropped_after_tls: Option<&'static str>,
}

impl Server {
    /// A TLS 1.3 server checks the client's certificate after the handshake is over on
    /// the client's side, and refuses by closing the connection: the first option then
    /// finds it gone. Say so, rather than give a bare I/O error.
    fn dropped(&self, e: Error) -> Error {
        let closed = match &e {
            Error::Io(_) => true,
            Error::Protocol(m) => m.starts_with(CLOSED_DURING),
            _ => false,
        };
        match self.dropped_after_tls {
            Some(hint) if closed => Error::Tls(format!("the server closed the connection after the TLS handshake ({e}): {hint}")),
            _ => e,
        }
    }
}

/// Connects, reads the greeting and, when the URI asks for TLS, starts it: the stream the
/// rest of the handshake goes over. Until TLS is up the socket is read unbuffered, so no
/// byte meant for TLS is taken as plaintext or the other way round. `for_kernel`: the TLS
/// session keeps what handing it to the kernel's TLS needs.
async fn begin(uri: &Uri, for_kernel: bool) -> Result<(Socket, Server), Error> {
    let host = match &uri.address {
        Address::Tcp { host, .. } => Some(host.as_str()),
        _ => None,
    };
    let prepare = if for_kernel { tls::prepare_for_kernel } else { tls::prepare };
    let prepared = uri.tls.as_ref().map(|t| prepare(t, host)).transpose()?;
    let mut socket = Socket::open(&uri.address).await?;
    let flags = greet(socket.stream()).await?;
    let mut server = Server { flags, tls: None, dropped_after_tls: None };
    if let Some(prepared) = prepared {
        let psk = prepared.psk();
        let stream = starttls(socket, prepared).await?;
        let ssl = stream.ssl();
        server.tls = Some(format!("{}, {}", ssl.version_str(), ssl.current_cipher().map_or("?", |c| c.name())));
        server.dropped_after_tls = match (psk, ssl.certificate().is_some()) {
            (true, _) => None,
            (false, true) => Some("it may have refused our client certificate (client-cert.pem)"),
            (false, false) => Some("it may want a client certificate (client-cert.pem and client-key.pem in the tls-certificates directory)"),
        };
        socket = Socket::Tls(Box::new(stream));
    }
    Ok((socket, server))
}

/// NBD_OPT_STARTTLS, the first option, then the TLS handshake. A server that refuses is
/// left politely, and never spoken to in plaintext again.
async fn starttls(mut socket: Socket, prepared: tls::Prepared) -> Result<tls::TlsStream, Error> {
    let mut out = Vec::new();
    wire_c::option(&mut out, OPT_STARTTLS, &[]);
    send(socket.stream(), &mut out).await?;
    let (rep, p) = reply(socket.stream(), OPT_STARTTLS).await?;
    match rep.kind {
        REP_ACK => prepared.connect(socket.into_stream()).await,
        _ if rep.is_error() => {
            let e = Error::Tls(format!("the server does not offer TLS: {}", refused("NBD_OPT_STARTTLS", &rep, &p)));
            let (mut r, mut w) = socket.split();
            abort(&mut r, &mut w).await;
            Err(e)
        }
        k => Err(Error::Protocol(format!("unexpected reply type {k:#x} to STARTTLS"))),
    }
}

/// How `read_exact` says the server closed the connection.
const CLOSED_DURING: &str = "the server closed the connection during";

async fn read_exact<R: AsyncRead + Unpin + ?Sized>(r: &mut R, buf: &mut [u8], what: &str) -> Result<(), Error> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::Protocol(format!("{CLOSED_DURING} {what}"))),
        Err(e) => Err(Error::io(e)),
    }
}

/// Reads the greeting and answers with our flags. Returns the server's handshake flags.
async fn greet<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(s: &mut S) -> Result<u16, Error> {
    let mut g = [0u8; GREETING_BYTES];
    read_exact(s, &mut g, "the greeting").await?;
    let flags = wire_c::decode_greeting(&g)?;
    if flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(Error::Refused("the server does not speak fixed newstyle NBD".into()));
    }
    let ours = FLAG_C_FIXED_NEWSTYLE | if flags & FLAG_NO_ZEROES != 0 { FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&ours.to_be_bytes()).await?;
    Ok(flags)
}

async fn send<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, out: &mut Vec<u8>) -> Result<(), Error> {
    w.write_all(out).await?;
    w.flush().await?;
    out.clear();
    Ok(())
}

/// Reads one option reply to `option`, with its payload (bounded).
async fn reply<R: AsyncRead + Unpin + ?Sized>(r: &mut R, option: u32) -> Result<(OptionReply, Vec<u8>), Error> {
    let mut h = [0u8; OPTION_REPLY_BYTES];
    read_exact(r, &mut h, "option negotiation").await?;
    let rep = OptionReply::decode(&h)?;
    if rep.option != option {
        return Err(Error::Protocol(format!("reply to option {} while waiting for option {option}", rep.option)));
    }
    if rep.len > OPTION_REPLY_MAX_BYTES {
        return Err(Error::Protocol(format!("option reply of {} bytes (limit {OPTION_REPLY_MAX_BYTES})", rep.len)));
    }
    let mut p = vec![0u8; rep.len as usize];
    read_exact(r, &mut p, "option negotiation").await?;
    Ok((rep, p))
}

fn refused(what: &str, rep: &OptionReply, payload: &[u8]) -> Error {
    let why = wire_c::option_error_name(rep.kind);
    match wire_c::decode_option_error_message(payload) {
        Some(m) => Error::Refused(format!("{what}: {why} ({m})")),
        None => Error::Refused(format!("{what}: {why}")),
    }
}

/// A plaintext client of a server that requires TLS: every option but STARTTLS is refused.
fn tls_required() -> Error {
    Error::Tls("the server requires TLS: connect with nbds:// (and tls-certificates=DIR or tls-psk-file=FILE as the server needs)".into())
}

/// Replies that end the handshake whatever the option was: a server shutting down wants
/// the client to leave politely (a soft disconnect), and one that requires TLS refuses
/// everything until it has it.
async fn fatal(r: &mut Reader, w: &mut Writer, rep: &OptionReply, payload: &[u8]) -> Result<(), Error> {
    let e = match rep.kind {
        REP_ERR_SHUTDOWN => refused("negotiation", rep, payload),
        REP_ERR_TLS_REQD => tls_required(),
        _ => return Ok(()),
    };
    abort(r, w).await;
    Err(e)
}

/// Asks for `option` (STRUCTURED_REPLY or EXTENDED_HEADERS, which take no data): whether
/// the server agreed. Any error reply but the fatal ones is a refusal to go on without.
async fn ask(r: &mut Reader, w: &mut Writer, option: u32) -> Result<bool, Error> {
    let mut out = Vec::new();
    wire_c::option(&mut out, option, &[]);
    send(w, &mut out).await?;
    let (rep, p) = reply(r, option).await?;
    fatal(r, w, &rep, &p).await?;
    if rep.kind != REP_ACK && !rep.is_error() {
        return Err(Error::Protocol(format!("unexpected reply type {:#x} to option {option}", rep.kind)));
    }
    if rep.is_error() {
        log::debug!("option {option} refused: {}", wire_c::option_error_name(rep.kind));
    }
    Ok(rep.kind == REP_ACK)
}

/// The reply style `options` ask for: extended headers when the server has them (they
/// imply structured replies), else structured replies. Returns (structured, extended).
async fn reply_style(r: &mut Reader, w: &mut Writer, options: &Options) -> Result<(bool, bool), Error> {
    if !options.structured {
        return Ok((false, false));
    }
    if options.extended && ask(r, w, OPT_EXTENDED_HEADERS).await? {
        return Ok((true, true));
    }
    Ok((ask(r, w, OPT_STRUCTURED_REPLY).await?, false))
}

/// Negotiates transmission of `export` on a fresh connection.
async fn negotiate(r: &mut Reader, w: &mut Writer, server: &Server, export: &str, options: &Options) -> Result<Negotiated, Error> {
    let mut out = Vec::new();
    let (structured, extended) = reply_style(r, w, options).await?;

    let mut base_allocation_id = None;
    if structured && options.block_status {
        wire_c::meta_context_request(&mut out, OPT_SET_META_CONTEXT, export, &[META_BASE_ALLOCATION]);
        send(w, &mut out).await?;
        let mut finished = false;
        for _ in 0..OPTION_REPLIES_MAX {
            let (rep, p) = reply(r, OPT_SET_META_CONTEXT).await?;
            fatal(r, w, &rep, &p).await?;
            match rep.kind {
                REP_META_CONTEXT => {
                    let (id, name) = wire_c::decode_meta_context(&p)?;
                    if name == META_BASE_ALLOCATION {
                        base_allocation_id = Some(id);
                    }
                }
                REP_ACK => {
                    finished = true;
                    break;
                }
                // A failed SET_META_CONTEXT selects no context, whatever it sent before.
                // An unknown export is reported by GO below, with a better message.
                k if rep.is_error() => {
                    log::debug!("SET_META_CONTEXT refused: {}", wire_c::option_error_name(k));
                    base_allocation_id = None;
                    finished = true;
                    break;
                }
                k => return Err(Error::Protocol(format!("unexpected reply type {k:#x} to SET_META_CONTEXT"))),
            }
        }
        if !finished {
            return Err(Error::Protocol("too many replies to SET_META_CONTEXT".into()));
        }
    }

    let infos = [INFO_BLOCK_SIZE, INFO_DESCRIPTION];
    wire_c::info_request(&mut out, OPT_GO, export, &infos);
    send(w, &mut out).await?;
    let mut ex = blank_export(export, structured, server.tls.clone());
    ex.extended = extended;
    match collect_info(r, OPT_GO, &mut ex).await {
        Ok(InfoOutcome::Ok) => {}
        // EXPORT_NAME is forbidden once extended headers are on; no such server exists.
        Ok(InfoOutcome::Unsupported) if extended => return Err(Error::Protocol("the server has extended headers but not NBD_OPT_GO".into())),
        Ok(InfoOutcome::Unsupported) => export_name(r, w, server.flags, &mut ex).await?,
        Err(e @ (Error::UnknownExport(_) | Error::Refused(_) | Error::Tls(_))) => {
            // The server is still in option haggling; leave it the polite way.
            abort(r, w).await;
            return Err(e);
        }
        Err(e) => return Err(e),
    }
    ex.base_allocation = base_allocation_id.is_some();
    Ok(Negotiated { export: ex, base_allocation_id })
}

fn blank_export(name: &str, structured: bool, tls: Option<String>) -> Export {
    Export {
        name: name.to_string(),
        description: None,
        size: 0,
        flags: 0,
        block_min: 1,
        block_preferred: 4096,
        block_max: REQUEST_DEFAULT_MAX_BYTES,
        structured,
        extended: false,
        base_allocation: false,
        tls,
    }
}

enum InfoOutcome {
    Ok,
    /// The server does not know GO/INFO.
    Unsupported,
}

/// Reads the replies to GO or INFO into `ex` until the final ACK.
async fn collect_info(r: &mut Reader, opt: u32, ex: &mut Export) -> Result<InfoOutcome, Error> {
    let mut got_export = false;
    for _ in 0..OPTION_REPLIES_MAX {
        let (rep, p) = reply(r, opt).await?;
        match rep.kind {
            REP_INFO => match wire_c::decode_info(&p)? {
                Info::Export { size, flags } => {
                    got_export = true;
                    ex.size = size;
                    ex.flags = flags;
                }
                Info::Description(d) => ex.description = Some(d),
                Info::Name(n) => ex.name = n,
                Info::BlockSize { min, preferred, max } => {
                    ex.block_min = min;
                    ex.block_preferred = preferred;
                    ex.block_max = max;
                }
                Info::Unknown(_) => {}
            },
            REP_ACK if got_export => return Ok(InfoOutcome::Ok),
            REP_ACK => return Err(Error::Protocol("the server finished GO without sending the export's size".into())),
            REP_ERR_UNSUP if opt == OPT_GO => return Ok(InfoOutcome::Unsupported),
            REP_ERR_UNKNOWN => return Err(Error::UnknownExport(ex.name.clone())),
            REP_ERR_TLS_REQD => return Err(tls_required()),
            _ if rep.is_error() => return Err(refused(&format!("export {:?}", ex.name), &rep, &p)),
            k => return Err(Error::Protocol(format!("unexpected reply type {k:#x} to option {opt}"))),
        }
    }
    Err(Error::Protocol("too many option replies".into()))
}

/// The old way in, for servers without NBD_OPT_GO: no error replies, so an unknown export
/// shows up as a closed connection.
async fn export_name(r: &mut Reader, w: &mut Writer, server_flags: u16, ex: &mut Export) -> Result<(), Error> {
    let mut out = Vec::new();
    wire_c::option(&mut out, OPT_EXPORT_NAME, ex.name.as_bytes());
    send(w, &mut out).await?;
    let mut b = [0u8; 10];
    if r.read_exact(&mut b).await.is_err() {
        return Err(Error::UnknownExport(ex.name.clone()));
    }
    ex.size = u64::from_be_bytes(b[0..8].try_into().unwrap());
    ex.flags = u16::from_be_bytes(b[8..10].try_into().unwrap());
    if server_flags & FLAG_NO_ZEROES == 0 {
        let mut pad = [0u8; EXPORT_NAME_PADDING_BYTES];
        read_exact(r, &mut pad, "EXPORT_NAME").await?;
    }
    // Structured replies were agreed before; EXPORT_NAME keeps them.
    Ok(())
}

/// Lists the server's exports with NBD_OPT_LIST; with `details`, asks NBD_OPT_INFO about
/// each one (servers without INFO leave `details` empty).
pub async fn list_exports(uri: &Uri, details: bool) -> Result<Vec<ExportEntry>, Error> {
    let deadline = Duration::from_millis(CONNECT_TIMEOUT_MS);
    tokio::time::timeout(deadline, async {
        let (socket, server) = begin(uri, false).await?;
        let (mut r, mut w) = socket.split();
        let mut entries = list(&mut r, &mut w).await.map_err(|e| server.dropped(e))?;
        if details {
            for e in &mut entries {
                describe(&mut r, &mut w, &server, e).await?;
            }
        }
        abort(&mut r, &mut w).await;
        Ok(entries)
    })
    .await
    .unwrap_or(Err(Error::Timeout))
}

/// NBD_OPT_LIST: the exports' names and descriptions.
async fn list(r: &mut Reader, w: &mut Writer) -> Result<Vec<ExportEntry>, Error> {
    let mut out = Vec::new();
    wire_c::option(&mut out, OPT_LIST, &[]);
    send(w, &mut out).await?;
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    loop {
        if entries.len() >= LIST_ENTRIES_MAX || bytes > LIST_BYTES_MAX {
            return Err(Error::Protocol(format!("the server lists more than {LIST_ENTRIES_MAX} exports or {LIST_BYTES_MAX} bytes of names")));
        }
        let (rep, p) = reply(r, OPT_LIST).await?;
        match rep.kind {
            REP_SERVER => {
                let (name, description) = wire_c::decode_server_entry(&p)?;
                bytes += p.len();
                entries.push(ExportEntry { name, description, details: None });
            }
            REP_ACK => return Ok(entries),
            _ if rep.is_error() => {
                let e = if rep.kind == REP_ERR_TLS_REQD { tls_required() } else { refused("listing exports", &rep, &p) };
                abort(r, w).await;
                return Err(e);
            }
            k => return Err(Error::Protocol(format!("unexpected reply type {k:#x} to LIST"))),
        }
    }
}

/// NBD_OPT_INFO about one listed export, into its `details`.
async fn describe(r: &mut Reader, w: &mut Writer, server: &Server, e: &mut ExportEntry) -> Result<(), Error> {
    let mut out = Vec::new();
    wire_c::info_request(&mut out, OPT_INFO, &e.name, &[INFO_BLOCK_SIZE, INFO_DESCRIPTION]);
    send(w, &mut out).await?;
    let mut ex = blank_export(&e.name, false, server.tls.clone());
    match collect_info(r, OPT_INFO, &mut ex).await {
        Ok(InfoOutcome::Ok) => {
            if e.description.is_none() {
                e.description = ex.description.clone();
            }
            e.details = Some(ex);
            Ok(())
        }
        // One export we may not look at should not hide the others.
        Ok(InfoOutcome::Unsupported) | Err(Error::Refused(_) | Error::UnknownExport(_)) => Ok(()),
        Err(other) => Err(other),
    }
}

/// Ends option haggling politely: NBD_OPT_ABORT, then a short wait for the ACK.
async fn abort(r: &mut Reader, w: &mut Writer) {
    let mut out = Vec::new();
    wire_c::option(&mut out, OPT_ABORT, &[]);
    if send(w, &mut out).await.is_ok() {
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), reply(r, OPT_ABORT)).await;
    }
    let _ = w.shutdown().await;
}
