//! A pool's control socket: the process that coordinates a mirrored pool listens on a Unix
//! socket named after the pool's id, so that `sluice pool check`/`repair`/`status` can
//! reach the coordinator that holds the pool instead of assembling it a second time.
//!
//! Where: `/run/sluice/pool-ID.sock` when /run/sluice can be made, else
//! `$XDG_RUNTIME_DIR/sluice/…`, else `/tmp/sluice-UID/…` (a directory this user owns, mode
//! 0700). The socket is mode 0600 and answers only its own user (or root); it goes when
//! the pool stops. One request per connection: one line of JSON (at most
//! `POOL_CONTROL_LINE_MAX_BYTES`, within `POOL_CONTROL_REQUEST_TIMEOUT_MS`):
//! `{"op":"check"}`, `{"op":"repair","from":URI}` (from optional) or `{"op":"status"}`;
//! the replies are JSON lines: `{"progress":REPORT}` while a scrub runs, then
//! `{"result":REPORT}`, `{"status":{…}}` or `{"error":TEXT}`. A scrub goes on when its
//! asker goes away, as md's `check` does.

use super::member::Member;
use super::pump::Shared;
use super::scrub_json::report_to_json;
use crate::limits::{POOL_CONTROL_LINE_MAX_BYTES, POOL_CONTROL_PROGRESS_MS, POOL_CONTROL_REQUEST_TIMEOUT_MS};
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Where the control socket of pool `id` may be, in the order a coordinator tries them.
pub(crate) fn socket_paths(id: &str) -> Vec<PathBuf> {
    let name = format!("pool-{id}.sock");
    let mut dirs = vec![PathBuf::from("/run/sluice")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        dirs.push(PathBuf::from(x).join("sluice"));
    }
    dirs.push(PathBuf::from(format!("/tmp/sluice-{}", euid())));
    dirs.into_iter().map(|d| d.join(&name)).collect()
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A directory only this user can use: made 0700 if new; an existing one must be ours and
/// writable by no one else.
fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => {}
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != euid() || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!("{} is not a directory of this user's alone", dir.display())));
    }
    Ok(())
}

/// Binds the first place that works; a socket left by a coordinator that died is replaced
/// (the pool's lease already made sure no live one holds the pool).
fn bind(id: &str) -> Result<(UnixListener, PathBuf), String> {
    let mut why = Vec::new();
    for path in socket_paths(id) {
        let dir = path.parent().expect("a file in a directory");
        let bound = private_dir(dir).and_then(|()| {
            let _ = std::fs::remove_file(&path);
            let l = UnixListener::bind(&path)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            Ok(l)
        });
        match bound {
            Ok(l) => return Ok((l, path)),
            Err(e) => why.push(format!("{}: {e}", path.display())),
        }
    }
    Err(why.join("; "))
}

/// Removes the socket when the listener ends.
struct Gone(PathBuf);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Listens for control requests for pool `id` until the pool stops.
pub(crate) fn listen<M: Member>(shared: &Arc<Shared<M>>, id: &str) {
    let (listener, path) = match bind(id) {
        Ok(bound) => bound,
        Err(why) => return log::warn!("pool {id}: no control socket ({why}); sluice pool check cannot reach this coordinator"),
    };
    log::info!("pool {id}: control socket {}", path.display());
    let (pool, mut stopped) = (Arc::downgrade(shared), shared.stopped());
    tokio::spawn(async move {
        let _gone = Gone(path);
        loop {
            let stream = tokio::select! {
                _ = stopped.wait_for(|&s| s) => return,
                a = listener.accept() => match a {
                    Ok((stream, _)) => stream,
                    Err(e) => return log::warn!("pool control socket: {e}"),
                },
            };
            tokio::spawn(answer(pool.clone(), stream));
        }
    });
}

/// One peer: its request, and the replies.
async fn answer<M: Member>(pool: Weak<Shared<M>>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let outcome = match peer_allowed(write.as_ref()) {
        Ok(()) => match read_request(read).await {
            Ok(req) => carry_out(&pool, &req, &mut write).await,
            Err(why) => Err(why),
        },
        Err(why) => Err(why),
    };
    if let Err(why) = outcome {
        let _ = send(&mut write, &json!({ "error": why })).await;
    }
}

/// Only this user (or root) may ask.
fn peer_allowed(stream: &UnixStream) -> Result<(), String> {
    let uid = stream.peer_cred().map_err(|e| e.to_string())?.uid();
    match uid == euid() || uid == 0 {
        true => Ok(()),
        false => Err(format!("user {uid} may not control this pool")),
    }
}

async fn read_request(read: tokio::net::unix::OwnedReadHalf) -> Result<Value, String> {
    let mut line = String::new();
    let mut limited = BufReader::new(read.take(POOL_CONTROL_LINE_MAX_BYTES + 1));
    let limit = Duration::from_millis(POOL_CONTROL_REQUEST_TIMEOUT_MS);
    match tokio::time::timeout(limit, limited.read_line(&mut line)).await {
        Err(_) => return Err(format!("no request within {limit:?}")),
        Ok(Err(e)) => return Err(format!("reading the request: {e}")),
        Ok(Ok(_)) => {}
    }
    if !line.ends_with('\n') {
        return Err(format!("a request is one line of at most {POOL_CONTROL_LINE_MAX_BYTES} bytes"));
    }
    serde_json::from_str(&line).map_err(|e| format!("the request is not JSON: {e}"))
}

async fn carry_out<M: Member>(pool: &Weak<Shared<M>>, req: &Value, write: &mut tokio::net::unix::OwnedWriteHalf) -> Result<(), String> {
    let gone = || "the pool stopped".to_string();
    let shared = pool.upgrade().ok_or_else(gone)?;
    let from = match req.get("from") {
        None | Some(Value::Null) => None,
        Some(Value::String(uri)) => Some(member_index(&shared, uri)?),
        Some(_) => return Err("\"from\" must be a member's URI".into()),
    };
    let repair = match req.get("op").and_then(Value::as_str) {
        Some("status") => return send(write, &json!({ "status": status_json(&shared.look(|c| c.coord.status())) })).await,
        Some("check") if from.is_none() => false,
        Some("check") => return Err("a check has no source: \"from\" goes with repair".into()),
        Some("repair") => true,
        _ => return Err("the request's \"op\" must be \"check\", \"repair\" or \"status\"".into()),
    };
    let before = shared.look(|c| c.coord.status().scrubs_completed);
    shared.run(|core, now| core.coord.start_scrub(repair, from, now))?;
    drop(shared);
    loop {
        tokio::time::sleep(Duration::from_millis(POOL_CONTROL_PROGRESS_MS)).await;
        let status = pool.upgrade().ok_or_else(gone)?.look(|c| c.coord.status());
        let report = status.scrub.as_ref().map(report_to_json);
        if status.scrubs_completed > before {
            return send(write, &json!({ "result": report })).await;
        }
        send(write, &json!({ "progress": report })).await?;
    }
}

/// The member a URI names, as the pool file (and so the coordinator) names it.
fn member_index<M: Member>(shared: &Arc<Shared<M>>, uri: &str) -> Result<usize, String> {
    let members: Vec<String> = shared.look(|c| c.coord.status().members.into_iter().map(|m| m.uri).collect());
    members.iter().position(|m| m == uri).ok_or_else(|| format!("{uri} is not a member of the pool (its members: {})", members.join(", ")))
}

fn status_json(s: &sluice_pool::Status) -> Value {
    let members: Vec<Value> = s.members.iter().map(|m| json!({"uri": m.uri, "state": m.state.name()})).collect();
    json!({
        "pool_id": s.pool_id,
        "owner": s.owner,
        "events": s.events,
        "dirty_regions": s.dirty_regions,
        "members": members,
        "scrub": s.scrub.as_ref().map(report_to_json),
        "scrubs_completed": s.scrubs_completed,
    })
}

async fn send(write: &mut tokio::net::unix::OwnedWriteHalf, v: &Value) -> Result<(), String> {
    let mut line = v.to_string();
    line.push('\n');
    write.write_all(line.as_bytes()).await.map_err(|e| format!("the asker went away: {e}"))
}
