//! A fork-join team of worker threads for the CPU kernels.
//!
//! Decode runs ~150 parallel regions per token, microseconds apart. A general pool wakes sleeping
//! workers through the OS for each region (tens of microseconds); this team keeps its workers
//! spinning on a generation counter while work keeps coming, so a region costs about a cache-line
//! round trip. Idle workers back off to `yield_now` and then to short sleeps, so an idle server
//! does not burn its cores. The calling thread is worker 0: `n` threads means `n - 1` spawned.
//!
//! Workers *join* a job while it is open; the caller closes it once its own share is done and
//! waits only for workers that joined. A worker the OS has descheduled (more runnable threads
//! than cores: parallel tests, a busy machine) therefore never stalls the caller: the work is
//! handed out dynamically and the caller simply does more of it.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = *const (dyn Fn(usize) + Sync);

/// `T` alone on its cache lines (128 bytes: the line and its prefetched neighbour), so a word one
/// thread writes does not evict a word another thread is spinning on or writing.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The words the caller writes (`generation`, `job`, `open`) and the one workers write (`active`)
/// live on separate lines: spinning workers read only the caller's line, the caller waits on theirs.
struct Shared {
    /// Bumped (Release) after `job` is written: a new job is published.
    generation: Padded<AtomicU64>,
    job: UnsafeCell<Option<Job>>,
    /// Whether workers may still join the current job.
    open: AtomicBool,
    /// Workers inside the current job.
    active: Padded<AtomicUsize>,
    panicked: AtomicBool,
    stop: AtomicBool,
}

// SAFETY: `job` is written only by the caller holding `Team::caller` while no worker reads it
// (every worker that joined the previous job has left it: `active == 0` after closing), and read by workers only after
// they observe the generation bump that follows the write (Release/Acquire on `generation`).
// The pointee is `Sync`, so calling it from several threads is allowed.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw job pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n: usize,
    /// Per thread, the items of its home range not yet taken by [`Team::for_items_home`]:
    /// (first, end) as `first | end << 32`, each on its own lines.
    homes: Box<[Padded<AtomicU64>]>,
    /// One job at a time.
    caller: Mutex<()>,
}

impl Team {
    /// A team of `n` threads (the caller plus `n - 1` workers).
    pub fn new(n: usize) -> std::io::Result<Team> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            generation: Padded(AtomicU64::new(0)),
            job: UnsafeCell::new(None),
            open: AtomicBool::new(false),
            active: Padded(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let workers = (1..n)
            .map(|idx| {
                let s = shared.clone();
                std::thread::Builder::new().name(format!("forge-cpu-{idx}")).spawn(move || worker(s, idx))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let homes = (0..n).map(|_| Padded(AtomicU64::new(0))).collect();
        Ok(Team { shared, workers, n, homes, caller: Mutex::new(()) })
    }

    pub fn threads(&self) -> usize {
        self.n
    }

    /// Runs `f(thread_index)` on the caller (index 0) and on every worker that joins before the
    /// caller's own call returns; returns when all of them have finished. `f` must hand out its
    /// work dynamically (see `for_chunks`): any subset of workers may take part. A panic in any
    /// of them is re-raised here after all have stopped.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n == 1 {
            return f(0);
        }
        let _guard = self.caller.lock().unwrap_or_else(|p| p.into_inner());
        self.run_held(f)
    }

    /// [`Team::run`] for a caller holding `self.caller`, with more than one thread.
    fn run_held(&self, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        // SAFETY: we erase the closure's lifetime to hand it to the workers. It stays valid: we
        // do not return (or unwind) before every worker that joined has left (`active == 0`
        // after closing), and a worker that did not join never reads the slot. The slot is
        // cleared before returning, while no worker is inside.
        unsafe {
            let job: Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f as *const _);
            *s.job.get() = Some(job);
        }
        s.open.store(true, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        s.open.store(false, Ordering::SeqCst);
        let t = super::prof::start();
        let mut spins = 0u32;
        while s.active.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins < 2_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        super::prof::stop(super::prof::Phase::TeamWait, t);
        // SAFETY: no worker is inside the job and none can join (closed): nobody reads the slot.
        unsafe { *s.job.get() = None };
        let worker_panicked = s.panicked.swap(false, Ordering::SeqCst);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if worker_panicked {
            panic!("a CPU worker thread panicked");
        }
    }

    /// Calls `f(i)` for every item of `0..n_items`, each once. Thread t starts on its home range
    /// (the t-th of `threads` equal parts) and takes its items in order, so each thread streams
    /// one contiguous run of the work (weights rows, for a matmul) and no two threads touch one
    /// counter until a thread's home is empty; then it takes the other homes' items from their
    /// ends. A thread that never joins leaves its home to the others. Which thread runs an item
    /// never changes what it computes.
    pub fn for_items_home(&self, n_items: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_items <= 1 || self.n == 1 {
            (0..n_items).for_each(f);
            return;
        }
        assert!(n_items < 1 << 32, "for_items_home: {n_items} items");
        let _guard = self.caller.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.n;
        for (t, h) in self.homes.iter().enumerate() {
            let (lo, hi) = (t * n_items / n, (t + 1) * n_items / n);
            // Before the job is published (SeqCst in `run_held`); the last job's threads have left.
            h.store(lo as u64 | (hi as u64) << 32, Ordering::Relaxed);
        }
        let homes = &self.homes;
        self.run_held(&|t| {
            while let Some(i) = take(&homes[t], true) {
                f(i);
            }
            for k in 1..n {
                while let Some(i) = take(&homes[(t + k) % n], false) {
                    f(i);
                }
            }
        });
    }

    /// Splits `0..n_items` into chunks of `chunk` handed out dynamically (an atomic counter) and
    /// calls `f(start..end)` for each. Which thread runs a chunk never changes what it computes.
    pub fn for_chunks(&self, n_items: usize, chunk: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        let n_chunks = n_items.div_ceil(chunk);
        if n_chunks <= 1 || self.n == 1 {
            for c in 0..n_chunks {
                f(c * chunk..((c + 1) * chunk).min(n_items));
            }
            return;
        }
        // On its own lines: both threads take chunks from it while the caller writes its stack.
        let next = Padded(AtomicUsize::new(0));
        self.run(&|_| loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            f(c * chunk..((c + 1) * chunk).min(n_items));
        });
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.generation.fetch_add(1, Ordering::Release);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Takes the first (`front`) or the last item left in a home range (`first | end << 32`).
fn take(h: &AtomicU64, front: bool) -> Option<usize> {
    let mut cur = h.load(Ordering::Relaxed);
    loop {
        let (first, end) = (cur & 0xFFFF_FFFF, cur >> 32);
        if first >= end {
            return None;
        }
        let (next, item) = if front { (cur + 1, first) } else { (first | (end - 1) << 32, end - 1) };
        match h.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Some(item as usize),
            Err(now) => cur = now,
        }
    }
}

fn worker(s: Arc<Shared>, idx: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then yield, then sleep briefly.
        let start = Instant::now();
        let mut spins = 0u32;
        let gen = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            spins = spins.wrapping_add(1);
            if spins < 4_000 {
                std::hint::spin_loop();
            } else if start.elapsed() < Duration::from_millis(5) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        seen = gen;
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // Join the job if it is still open; otherwise the caller already finished it.
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.open.load(Ordering::SeqCst) {
            // SAFETY: joined while open: the caller keeps the closure alive and the slot
            // unchanged until `active` drops to zero.
            if let Some(job) = unsafe { *s.job.get() } {
                // SAFETY: as above.
                let f = unsafe { &*job };
                if catch_unwind(AssertUnwindSafe(|| f(idx))).is_err() {
                    s.panicked.store(true, Ordering::SeqCst);
                }
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn workers_join_jobs() {
        let team = Team::new(3).expect("team");
        let by_thread: Vec<AtomicU32> = (0..3).map(|_| AtomicU32::new(0)).collect();
        for _ in 0..2000 {
            team.run(&|i| {
                by_thread[i].fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(20));
            });
        }
        assert_eq!(by_thread[0].load(Ordering::Relaxed), 2000);
        assert!(by_thread[1].load(Ordering::Relaxed) + by_thread[2].load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn chunks_cover_every_item_once() {
        let team = Team::new(2).expect("team");
        let seen: Vec<AtomicU32> = (0..1003).map(|_| AtomicU32::new(0)).collect();
        team.for_chunks(1003, 10, &|r| {
            for i in r {
                seen[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn home_items_are_each_taken_once() {
        for threads in [2, 3] {
            let team = Team::new(threads).expect("team");
            for n_items in [0, 1, 2, 5, 97, 1000] {
                let seen: Vec<AtomicU32> = (0..n_items).map(|_| AtomicU32::new(0)).collect();
                team.for_items_home(n_items, &|i| {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1), "{threads} threads, {n_items} items");
            }
        }
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_team_survives() {
        let team = Team::new(2).expect("team");
        let r = catch_unwind(AssertUnwindSafe(|| team.run(&|_| panic!("boom"))));
        assert!(r.is_err());
        let hits = AtomicU32::new(0);
        team.for_chunks(100, 1, &|r| {
            hits.fetch_add(r.len() as u32, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 100);
    }
}
