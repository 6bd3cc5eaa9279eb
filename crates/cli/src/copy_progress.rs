//! Progress of `sluice copy` on standard error: a bar when stderr is a terminal, plain
//! lines once a second with --progress when it is not, nothing otherwise.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often --progress prints a line.
const PROGRESS_LINE_INTERVAL_MS: u64 = 1000;

pub struct Progress {
    done: AtomicU64,
    /// None when the source is a stream.
    total: Option<u64>,
    bar: Option<ProgressBar>,
    lines: bool,
    ticker: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Progress {
    /// Call inside the runtime: the line printer is a task.
    pub fn start(total: Option<u64>, lines_wanted: bool) -> Arc<Progress> {
        let terminal = std::io::stderr().is_terminal();
        let bar = terminal.then(|| {
            let (bar, template) = match total {
                Some(t) => (ProgressBar::new(t), "{elapsed_precise} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}"),
                None => (ProgressBar::no_length(), "{elapsed_precise} {spinner} {binary_bytes} {binary_bytes_per_sec}"),
            };
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let p = Arc::new(Progress {
            done: AtomicU64::new(0),
            total,
            bar,
            lines: lines_wanted && !terminal,
            ticker: std::sync::Mutex::new(None),
        });
        if p.lines {
            let me = p.clone();
            let task = tokio::spawn(async move {
                let period = Duration::from_millis(PROGRESS_LINE_INTERVAL_MS);
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                loop {
                    tick.tick().await;
                    me.print_line();
                }
            });
            *p.ticker.lock().unwrap() = Some(task);
        }
        p
    }

    pub fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    fn print_line(&self) {
        let done = self.done.load(Ordering::Relaxed);
        match self.total {
            Some(0) => eprintln!("sluice copy: progress 0/0 bytes (100%)"),
            Some(t) => eprintln!(
                "sluice copy: progress {done}/{t} bytes ({}%)",
                done.min(t) * 100 / t
            ),
            None => eprintln!("sluice copy: progress {done} bytes"),
        }
    }

    fn stop_ticker(&self) {
        if let Some(t) = self.ticker.lock().unwrap().take() {
            t.abort();
        }
    }

    /// The copy succeeded: a full bar, or a last line.
    pub fn finish(&self) {
        self.stop_ticker();
        if let Some(bar) = &self.bar {
            bar.finish();
        }
        if self.lines {
            self.print_line();
        }
    }

    /// The copy failed: leave the bar where it stopped, print no more lines.
    pub fn abandon(&self) {
        self.stop_ticker();
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}
