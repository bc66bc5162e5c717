//! Fact embeddings in the background, yielding to requests.
//!
//! Every computed answer leaves facts behind; their embeddings only serve later fact searches,
//! so they must not compete with the model for the CPU. One thread (at the lowest scheduling
//! priority, `nice 19`) embeds them in small batches, and only while the service has no request
//! in flight — unless a tenant's facts have waited longer than `max_wait`, which bounds how
//! long a busy service leaves facts unsearchable (progress is guaranteed, at low priority).
//!
//! Nothing is lost: the facts are in the store; which ones still lack an embedding is read from
//! it ([`crate::store::Store::unindexed_facts`]), so a tenant notified twice, an indexing error
//! or a restart (the service enqueues every tenant with unindexed facts at start) only delays
//! indexing. One worker also means two batches never embed the same facts.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// When and how much the worker indexes.
#[derive(Debug, Clone, Copy)]
pub struct IndexerConfig {
    /// How often a waiting worker checks whether the service went idle.
    pub poll: Duration,
    /// Facts waiting longer than this are indexed even while requests run.
    pub max_wait: Duration,
    /// Facts embedded per batch (the worker re-checks for requests between batches).
    pub batch: usize,
}

impl Default for IndexerConfig {
    fn default() -> Self {
        IndexerConfig { poll: Duration::from_millis(5), max_wait: Duration::from_secs(5), batch: 8 }
    }
}

/// `index(tenant, limit)`: embeds at most `limit` unindexed facts of `tenant`, returns how many.
pub type IndexFn = dyn Fn(&str, usize) -> Result<usize, String> + Send + Sync;
/// Whether the service has no work now.
pub type IdleFn = dyn Fn() -> bool + Send + Sync;

#[derive(Default)]
struct Queue {
    /// tenant → (notifications so far, when the oldest unserved one came)
    tenants: BTreeMap<String, (u64, Instant)>,
    /// A batch is running.
    working: bool,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Handle to the worker; dropping it stops the worker after its current batch.
pub struct FactIndexer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl FactIndexer {
    pub fn spawn(config: IndexerConfig, idle: Arc<IdleFn>, index: Arc<IndexFn>) -> std::io::Result<FactIndexer> {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), cv: Condvar::new() });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("forge-facts".into()).spawn(move || {
            lower_priority();
            worker(&s, config, idle.as_ref(), index.as_ref())
        })?;
        Ok(FactIndexer { shared, thread: Some(thread) })
    }

    /// `tenant` has new facts to index.
    pub fn notify(&self, tenant: &str) {
        let mut q = self.shared.lock();
        let e = q.tenants.entry(tenant.to_string()).or_insert((0, Instant::now()));
        e.0 += 1;
        self.shared.cv.notify_all();
    }

    /// Tenants waiting to be indexed, and whether a batch is running.
    pub fn pending(&self) -> (usize, bool) {
        let q = self.shared.lock();
        (q.tenants.len(), q.working)
    }

    /// Waits until no tenant is pending and no batch runs (at most `timeout`); whether it did.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        let q = self.shared.lock();
        let (q, res) = self.shared.cv.wait_timeout_while(q, timeout, |q| !q.tenants.is_empty() || q.working).unwrap_or_else(|p| p.into_inner());
        drop(q);
        !res.timed_out()
    }
}

impl Drop for FactIndexer {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn worker(s: &Shared, config: IndexerConfig, idle: &IdleFn, index: &IndexFn) {
    loop {
        // The tenant waiting longest.
        let (tenant, seen, since) = {
            let mut q = s.lock();
            q.working = false;
            s.cv.notify_all();
            q = s.cv.wait_while(q, |q| q.tenants.is_empty() && !q.stop).unwrap_or_else(|p| p.into_inner());
            if q.stop {
                return;
            }
            let Some((t, &(n, at))) = q.tenants.iter().min_by_key(|(_, (_, at))| *at) else { continue };
            let t = t.clone();
            q.working = true;
            (t, n, at)
        };
        // Yield to requests, up to max_wait after the facts came.
        while !idle() && since.elapsed() < config.max_wait {
            if s.lock().stop {
                return;
            }
            std::thread::sleep(config.poll);
        }
        let done = match index(&tenant, config.batch.max(1)) {
            Ok(n) => n < config.batch.max(1),
            Err(e) => {
                tracing::warn!(tenant = %tenant, error = %e, "embedding new facts failed (retried at its next answer)");
                true
            }
        };
        let mut q = s.lock();
        if let Some(e) = q.tenants.get_mut(&tenant) {
            if done && e.0 == seen {
                // Everything up to the last notification is indexed.
                q.tenants.remove(&tenant);
            } else if done {
                // Notified again meanwhile: its new facts wait from now.
                e.1 = Instant::now();
            }
        }
    }
}

/// Runs this thread at the lowest priority (`nice 19`), so the engine's threads preempt it.
fn lower_priority() {
    crate::background::lower_this_thread(19);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A fake store: `facts` unindexed facts per call of `add`; `index` takes them in batches.
    struct Fake {
        unindexed: AtomicUsize,
        indexed: AtomicUsize,
    }

    fn setup(config: IndexerConfig, idle: Arc<AtomicBool>) -> (Arc<Fake>, FactIndexer) {
        let fake = Arc::new(Fake { unindexed: AtomicUsize::new(0), indexed: AtomicUsize::new(0) });
        let f = fake.clone();
        let index: Arc<IndexFn> = Arc::new(move |_t: &str, limit: usize| {
            let n = f.unindexed.load(Ordering::SeqCst).min(limit);
            f.unindexed.fetch_sub(n, Ordering::SeqCst);
            f.indexed.fetch_add(n, Ordering::SeqCst);
            Ok(n)
        });
        let idle_fn: Arc<IdleFn> = Arc::new(move || idle.load(Ordering::SeqCst));
        (fake, FactIndexer::spawn(config, idle_fn, index).expect("spawn"))
    }

    #[test]
    fn waits_for_idle_then_indexes_everything() {
        let idle = Arc::new(AtomicBool::new(false));
        let config = IndexerConfig { poll: Duration::from_millis(1), max_wait: Duration::from_secs(3600), batch: 3 };
        let (fake, ix) = setup(config, idle.clone());
        fake.unindexed.store(10, Ordering::SeqCst);
        ix.notify("t");
        // Busy: nothing is indexed.
        assert!(!ix.wait_drained(Duration::from_millis(100)));
        assert_eq!(fake.indexed.load(Ordering::SeqCst), 0);
        // Idle: all of it, in batches of 3.
        idle.store(true, Ordering::SeqCst);
        assert!(ix.wait_drained(Duration::from_secs(10)));
        assert_eq!((fake.indexed.load(Ordering::SeqCst), fake.unindexed.load(Ordering::SeqCst)), (10, 0));
        assert_eq!(ix.pending(), (0, false));
    }

    #[test]
    fn a_busy_service_still_gets_its_facts_indexed_after_max_wait() {
        let idle = Arc::new(AtomicBool::new(false));
        let config = IndexerConfig { poll: Duration::from_millis(1), max_wait: Duration::from_millis(50), batch: 4 };
        let (fake, ix) = setup(config, idle);
        fake.unindexed.store(9, Ordering::SeqCst);
        ix.notify("a");
        ix.notify("b");
        assert!(ix.wait_drained(Duration::from_secs(10)), "never indexed while busy");
        assert_eq!((fake.indexed.load(Ordering::SeqCst), fake.unindexed.load(Ordering::SeqCst)), (9, 0));
    }

    #[test]
    fn facts_added_while_indexing_are_not_lost() {
        let idle = Arc::new(AtomicBool::new(true));
        let config = IndexerConfig { poll: Duration::from_millis(1), max_wait: Duration::from_secs(3600), batch: 2 };
        let (fake, ix) = setup(config, idle);
        for _ in 0..50 {
            fake.unindexed.fetch_add(3, Ordering::SeqCst);
            ix.notify("t");
            std::thread::yield_now();
        }
        assert!(ix.wait_drained(Duration::from_secs(10)));
        assert_eq!((fake.indexed.load(Ordering::SeqCst), fake.unindexed.load(Ordering::SeqCst)), (150, 0));
    }

    #[test]
    fn errors_are_retried_at_the_next_notification() {
        let fails = Arc::new(AtomicBool::new(true));
        let (calls, f) = (Arc::new(AtomicUsize::new(0)), fails.clone());
        let c = calls.clone();
        let index: Arc<IndexFn> = Arc::new(move |_t: &str, _l: usize| {
            c.fetch_add(1, Ordering::SeqCst);
            if f.load(Ordering::SeqCst) {
                Err("disk full".into())
            } else {
                Ok(0)
            }
        });
        let ix = FactIndexer::spawn(IndexerConfig::default(), Arc::new(|| true), index).expect("spawn");
        ix.notify("t");
        assert!(ix.wait_drained(Duration::from_secs(10)));
        fails.store(false, Ordering::SeqCst);
        ix.notify("t");
        assert!(ix.wait_drained(Duration::from_secs(10)));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
