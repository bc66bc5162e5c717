//! A value built on its own thread while start-up goes on (ground floor: imports nothing of the
//! crate). `serve` starts answering what needs neither the model's tokenizer nor the sentence
//! embedder (EXACT hits) while both are still being built; the first call that needs one waits
//! for it ([`Background::get`]).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A value being built on a thread of its own, or built: cloning shares it.
pub struct Background<T> {
    cell: Arc<OnceLock<Built<T>>>,
}

/// What the build left: the value or why there is none, and how long it took.
struct Built<T> {
    value: Result<T, String>,
    took: Duration,
}

impl<T> Clone for Background<T> {
    fn clone(&self) -> Self {
        Background { cell: self.cell.clone() }
    }
}

/// The nice value of a start-up build thread: on two cores, the start-up path (and the first
/// requests) keep a core while the builds share what is left.
pub const BUILD_NICE: i32 = 10;

impl<T: Send + Sync + 'static> Background<T> {
    /// Runs `build` on a new thread called `name`, at nice [`BUILD_NICE`]; a panic in it becomes
    /// an error.
    pub fn spawn(name: &str, build: impl FnOnce() -> Result<T, String> + Send + 'static) -> std::io::Result<Background<T>> {
        let cell = Arc::new(OnceLock::new());
        let slot = cell.clone();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            lower_this_thread(BUILD_NICE);
            let t = Instant::now();
            let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)).unwrap_or_else(|_| Err("its builder panicked".into()));
            let _ = slot.set(Built { value, took: t.elapsed() });
        })?;
        Ok(Background { cell })
    }
}

impl<T> Background<T> {
    /// A value that is already there.
    pub fn ready(value: T) -> Background<T> {
        Background { cell: Arc::new(OnceLock::from(Built { value: Ok(value), took: Duration::ZERO })) }
    }

    /// The value, waiting while it is being built; the build's error when it failed.
    pub fn get(&self) -> Result<&T, &str> {
        self.cell.wait().value.as_ref().map_err(String::as_str)
    }

    /// The value or the build's error if the build has ended; `None` while it runs (no waiting).
    pub fn try_get(&self) -> Option<Result<&T, &str>> {
        self.cell.get().map(|b| b.value.as_ref().map_err(String::as_str))
    }

    /// How long the build took, once it has ended.
    pub fn build_time(&self) -> Option<Duration> {
        self.cell.get().map(|b| b.took)
    }
}

/// Lowers the calling thread's priority to nice `nice` (Linux: per thread), so the other
/// threads of the process preempt it; elsewhere nothing.
#[cfg(target_os = "linux")]
pub fn lower_this_thread(nice: i32) {
    // SAFETY: plain system calls without pointers; `gettid` cannot fail, and `setpriority` on
    // our own thread id only changes this thread's nice value (a failure is harmless).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
}

/// Lowers the calling thread's priority (not on this platform).
#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread(_nice: i32) {}

#[cfg(test)]
mod tests {
    use super::Background;
    use std::sync::mpsc;

    #[test]
    fn get_waits_for_the_build_and_try_get_does_not() {
        let (go, wait) = mpsc::channel::<()>();
        let b = Background::spawn("test-build", move || {
            wait.recv().map_err(|e| e.to_string())?;
            Ok(7)
        })
        .expect("spawn");
        assert!(b.try_get().is_none(), "still building");
        assert!(b.build_time().is_none());
        go.send(()).expect("send");
        assert_eq!(b.clone().get(), Ok(&7));
        assert_eq!(b.try_get(), Some(Ok(&7)));
        assert!(b.build_time().is_some());
    }

    #[test]
    fn errors_and_panics_are_kept() {
        let failed: Background<u8> = Background::spawn("test-fail", || Err("no vocabulary".into())).expect("spawn");
        assert_eq!(failed.get(), Err("no vocabulary"));
        let panicked: Background<u8> = Background::spawn("test-panic", || panic!("boom")).expect("spawn");
        assert_eq!(panicked.get(), Err("its builder panicked"));
        assert_eq!(Background::ready(3).try_get(), Some(Ok(&3)));
    }
}
