//! The asking side of a pool's control socket (see `control`): `sluice pool check` and
//! `repair` send their request to the coordinator that serves the pool, and follow its
//! progress to the result.

use super::control::socket_paths;
use super::scrub_json::report_from_json;
use crate::error::Error;
use crate::limits::POOL_CONTROL_REPLY_MAX_BYTES;
use serde_json::Value;
use sluice_pool::coordinator::ScrubReport;
use sluice_pool::Status;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// A coordinator sends progress twice a second; one silent for this long is stuck.
const SILENCE_MAX: Duration = Duration::from_secs(30);
/// A status answer comes at once; `pool status` does not wait long for one.
const LIVE_STATUS_LIMIT: Duration = Duration::from_secs(2);

/// Asks the coordinator of pool `id` on this host to check (or repair, from `from`) and
/// returns its report; `progress` sees each progress report.
pub(crate) async fn ask_scrub(id: &str, repair: bool, from: Option<&str>, progress: impl Fn(&ScrubReport)) -> Result<ScrubReport, Error> {
    let (stream, path) = connect(id).await?;
    let request = serde_json::json!({ "op": if repair { "repair" } else { "check" }, "from": from });
    let (read, mut write) = stream.into_split();
    let fail = |what: String| Error::Pool(format!("the coordinator's control socket {}: {what}", path.display()));
    write.write_all(format!("{request}\n").as_bytes()).await.map_err(|e| fail(e.to_string()))?;
    let mut lines = BufReader::new(read);
    loop {
        let (reply, line) = read_reply(&mut lines, SILENCE_MAX).await.map_err(fail)?;
        if let Some(why) = reply.get("error").and_then(Value::as_str) {
            return Err(Error::Refused(why.to_owned()));
        }
        let report = |k: &str| reply.get(k).and_then(report_from_json);
        match (report("result"), report("progress")) {
            (Some(r), _) => return Ok(r),
            (None, Some(p)) => progress(&p),
            _ => return Err(fail(format!("an unexpected reply: {}", line.trim_end()))),
        }
    }
}

/// One reply line, within `limit`.
async fn read_reply(lines: &mut BufReader<tokio::net::unix::OwnedReadHalf>, limit: Duration) -> Result<(Value, String), String> {
    let mut line = String::new();
    let mut limited = lines.take(POOL_CONTROL_REPLY_MAX_BYTES);
    match tokio::time::timeout(limit, limited.read_line(&mut line)).await {
        Err(_) => return Err(format!("no word for {limit:?}")),
        Ok(Err(e)) => return Err(e.to_string()),
        Ok(Ok(0)) => return Err("it closed before the result".into()),
        Ok(Ok(_)) => {}
    }
    let reply = serde_json::from_str(&line).map_err(|e| format!("a reply is not JSON: {e}"))?;
    Ok((reply, line))
}

/// For a pool that a coordinator on this host serves: the scrub it runs now (or ran last,
/// with its ranges), asked over its control socket; `status` (read from the superblocks)
/// is left as it is when the coordinator cannot be asked.
pub async fn with_live_scrub(mut status: Status) -> Status {
    let owner = status.owner.clone().unwrap_or_default();
    let host = owner.rsplit_once(" pid ").map(|(h, _)| h);
    if host != Some(super::session::host_name().as_str()) {
        return status;
    }
    let asked = async {
        let (stream, _) = connect(&status.pool_id).await.map_err(|e| e.to_string())?;
        let (read, mut write) = stream.into_split();
        write.write_all(b"{\"op\":\"status\"}\n").await.map_err(|e| e.to_string())?;
        read_reply(&mut BufReader::new(read), LIVE_STATUS_LIMIT).await
    };
    match asked.await {
        Ok((reply, _)) => {
            let live = &reply["status"];
            if let Some(n) = live["scrubs_completed"].as_u64() {
                status.scrubs_completed = n;
                status.scrub = report_from_json(&live["scrub"]).or(status.scrub);
            }
        }
        Err(why) => log::info!("the pool's coordinator could not be asked for its scrub: {why}"),
    }
    status
}

/// The first control socket of pool `id` that answers.
async fn connect(id: &str) -> Result<(UnixStream, std::path::PathBuf), Error> {
    let mut tried = Vec::new();
    for path in socket_paths(id) {
        match UnixStream::connect(&path).await {
            Ok(s) => return Ok((s, path)),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    Err(Error::Pool(format!("the coordinator serving the pool has no control socket here ({})", tried.join("; "))))
}
