//! The stop conditions `--max-records` and `--exit-when-idle-ms`, and the progress lines of
//! the embedded mode.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_runtime::StopHandle;

use super::outputs::Progress;
use super::say;

/// Stops the job on `--max-records` and `--exit-when-idle-ms`; with the embedded broker it
/// prints the progress every 2 s.
pub(crate) fn spawn_watcher(
    progress: Arc<Progress>,
    stop: StopHandle,
    done: Arc<AtomicBool>,
    max: Option<u64>,
    idle: Option<Duration>,
    verbose: bool,
) {
    if max.is_none() && idle.is_none() && !verbose {
        return;
    }
    std::thread::spawn(move || {
        let mut last_print = Instant::now();
        // input was last seen when the processed count last moved (checked every 50 ms); the
        // idle clock starts when the job has started (`job started`), so a slow start-up
        // (fencing, recovery) does not count as idle input
        let mut last_n = progress.processed.load(Ordering::Relaxed);
        let mut last_input: Option<Instant> = None;
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            let n = progress.processed.load(Ordering::Relaxed);
            if n != last_n || (last_input.is_none() && progress.started()) {
                (last_n, last_input) = (n, Some(Instant::now()));
            }
            if max.is_some_and(|m| n >= m) {
                tracing::info!(
                    processed = n,
                    "--max-records reached: stopping with a final checkpoint"
                );
                stop.stop();
                return;
            }
            if let Some(idle) = idle {
                if last_input.is_some_and(|t| t.elapsed() >= idle) {
                    tracing::info!("--exit-when-idle-ms reached: stopping with a final checkpoint");
                    stop.stop();
                    return;
                }
            }
            if verbose && last_print.elapsed() >= Duration::from_secs(2) {
                last_print = Instant::now();
                say(format!("progress: {n} records processed"));
            }
        }
    });
}
