//! The asking side of a pool's control socket (see `control`): `sluice pool check` and
//! `repair` send their request to the coordinator that serves the pool, and follow its
//! progress to the result.

use super::control::socket_paths;
use super::scrub_json::report_from_json;
use crate::error::Error;
use crate::limits::POOL_CONTROL_REPLY_MAX_BYTES;
use serde_json::Value;
use sluice_pool::coordinator::ScrubReport;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// A coordinator sends progress twice a second; one silent for this long is stuck.
const SILENCE_MAX: Duration = Duration::from_secs(30);

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
        let mut line = String::new();
        let mut limited = (&mut lines).take(POOL_CONTROL_REPLY_MAX_BYTES);
        match tokio::time::timeout(SILENCE_MAX, limited.read_line(&mut line)).await {
            Err(_) => return Err(fail(format!("no word for {SILENCE_MAX:?}"))),
            Ok(Err(e)) => return Err(fail(e.to_string())),
            Ok(Ok(0)) => return Err(fail("it closed before the result".into())),
            Ok(Ok(_)) => {}
        }
        let reply: Value = serde_json::from_str(&line).map_err(|e| fail(format!("a reply is not JSON: {e}")))?;
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
