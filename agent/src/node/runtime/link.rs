//! The live agent's link to the container runtime
//! (`--container-runtime-endpoint`): a thread of its own, with its own
//! tokio runtime, that holds the CRI connection. Everything slow the
//! runtime side does (CRI calls that may hang up to their timeout, walking
//! the pods' directories) happens there, so the decision loop, whose memory
//! path must never wait, only ever reads what the thread left behind.
//!
//! A runtime that cannot be reached does not stop the agent: memory and
//! PIDs need no runtime, and disk decisions are held until it answers. The
//! failure is logged (naming the socket), counted, and the thread connects
//! again, backing off.
//!
//! The pods' disk usage is read lazily: only when a disk decision asks for
//! it ([`RuntimeLink::pod_usage`]), and then kept for [`USAGE_MAX_AGE`].
//! Walking every pod's logs and volumes on each memory event would cost the
//! memory path what evictd exists to save; a disk signal moves slowly, and
//! the writable layers' sizes the runtime reports are themselves refreshed
//! only every 10 s.
//!
//! Node-level reclaim (kubelet's `reclaimNodeLevelResources`) runs here
//! too, when a disk decision asks ([`RuntimeLink::reclaim`]), one round per
//! signal: dead containers and unused images are removed, and the decision
//! looks at the node again before it evicts anyone.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::Notify;
use tracing::{debug, info, warn};

pub use super::reclaim::NodeReclaim;
use super::{
    RuntimeClient, RuntimeError,
    disk_usage::PodDiskUsage,
    filesystems::{DiskLayout, FilesystemsError, RuntimeFilesystems},
    reading::{DiskReading, FsPaths},
    reclaim::{self, ImageTracker, ReclaimRequest, ReclaimRounds, ReclaimStep, Removal},
};
use crate::{decide::thresholds::Signal, report::metrics::Metrics};

/// How old the pods' disk usage may be for a decision: containerd's
/// `stats_collect_period` (10 s by default), how often it measures the
/// writable layers, and kubelet's housekeeping period, at which kubelet's
/// own eviction manager sees disk usage.
pub const USAGE_MAX_AGE: Duration = Duration::from_secs(10);
/// After a failed reading, how long before the next: a runtime that fails
/// is not asked again on every 20 ms close watch.
const READ_RETRY: Duration = Duration::from_secs(1);

/// First wait before connecting again; doubled after each failure.
const RECONNECT_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between two connection attempts: a runtime restarted by
/// its node's operator is back in use within a minute.
const RECONNECT_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("starting the container runtime thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The decision loop's handle on the link; cheap to clone.
#[derive(Clone)]
pub struct RuntimeLink {
    shared: Arc<Shared>,
}

/// Stops the link's thread when dropped (at the agent's shutdown).
pub struct LinkThread {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: String,
    /// kubelet's root directory (`--nodefs-path`): nodefs, and the pods'
    /// volumes below `pods/`.
    kubelet_root: PathBuf,
    state: Mutex<State>,
    /// Bumped whenever the filesystems change, so that the loop's every
    /// observation costs one atomic load, not a lock and a copy.
    filesystems_changed: AtomicU64,
    /// Wakes the thread: work was asked for, or it must stop.
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Whether the runtime answered the last call.
    connected: bool,
    stopping: bool,
    /// Where the runtime last said its filesystems are, and their layout.
    filesystems: Option<(FsPaths, DiskLayout)>,
    /// The last reading of the pods' disk usage, and when it was taken.
    usage: Option<(Instant, Arc<BTreeMap<String, PodDiskUsage>>)>,
    /// A decision waits for a fresh reading.
    usage_wanted: bool,
    /// The last reading failed.
    usage_failed: bool,
    reclaims: ReclaimRounds,
}

/// The pods' disk usage as a decision can have it now.
#[derive(Debug, Clone)]
pub enum PodUsage {
    /// Read within [`USAGE_MAX_AGE`], by pod uid.
    Fresh(Arc<BTreeMap<String, PodDiskUsage>>),
    /// Being read: decide once it is there.
    Pending,
    /// The runtime is down or the last reading failed: the disk decision
    /// is held until a reading comes (one is asked for).
    Unavailable,
}

impl RuntimeLink {
    /// Starts the thread, which connects at once; `kubelet_root` is
    /// `--nodefs-path`, and `images` what node reclaim knows of the images.
    pub fn start(
        endpoint: String,
        kubelet_root: PathBuf,
        metrics: Arc<Metrics>,
        images: ImageTracker,
    ) -> Result<(Self, LinkThread), LinkError> {
        let shared = Arc::new(Shared {
            endpoint,
            kubelet_root,
            state: Mutex::new(State::default()),
            filesystems_changed: AtomicU64::new(0),
            wake: Notify::new(),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(LinkError::Thread)?;
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("evictd-cri".into())
            .spawn(move || runtime.block_on(serve(thread_shared, metrics, images)))
            .map_err(LinkError::Thread)?;
        Ok((
            Self {
                shared: shared.clone(),
            },
            LinkThread { shared },
        ))
    }

    /// Whether the runtime answered the last call.
    pub fn connected(&self) -> bool {
        self.shared.state().connected
    }

    /// Where the imagefs and containerfs signals are measured, once the
    /// runtime has said.
    pub fn filesystems(&self) -> Option<FsPaths> {
        self.shared
            .state()
            .filesystems
            .as_ref()
            .map(|(paths, _)| paths.clone())
    }

    /// How many times the filesystems have changed: call
    /// [`filesystems`](Self::filesystems) again only when this moves.
    pub fn filesystems_version(&self) -> u64 {
        self.shared.filesystems_changed.load(Ordering::Acquire)
    }

    /// Node-level reclaim before a decision for `signal` at `now`: asks the
    /// thread for a round of the signal's steps when none was done for it
    /// in the last [`USAGE_MAX_AGE`] (kubelet reclaims on every synchronize
    /// round under pressure, every 10 s). With `dry_run` the thread only
    /// logs what it would remove; `live_pods` (asked only for a new round,
    /// without the lock the thread takes) are the pods alive whose newest
    /// dead containers stay.
    pub fn reclaim(
        &self,
        signal: Signal,
        dry_run: bool,
        now: Instant,
        live_pods: impl FnOnce() -> BTreeSet<String>,
    ) -> NodeReclaim {
        let mut state = self.shared.state();
        if !state.connected {
            return NodeReclaim::Unavailable;
        }
        let Some((_, layout)) = state.filesystems else {
            return NodeReclaim::Unavailable;
        };
        let steps = reclaim::steps_for(signal, layout);
        if steps.is_empty() {
            return NodeReclaim::Unavailable;
        }
        if let Some(reclaim) = state.reclaims.status(signal, now, USAGE_MAX_AGE) {
            return reclaim;
        }
        drop(state);
        let live_pods = live_pods();
        self.shared.state().reclaims.request(ReclaimRequest {
            signal,
            steps,
            dry_run,
            live_pods,
        });
        self.shared.wake.notify_one();
        NodeReclaim::Pending
    }

    /// Pod `uid`'s disk usage in the last reading, however old: what the
    /// decision that just ranked it saw.
    pub fn last_pod_usage(&self, uid: &str) -> Option<PodDiskUsage> {
        self.shared
            .state()
            .usage
            .as_ref()
            .and_then(|(_, pods)| pods.get(uid).cloned())
    }

    /// The pods' disk usage for a decision at `now`; asks the thread for a
    /// fresh reading when the last is older than [`USAGE_MAX_AGE`].
    pub fn pod_usage(&self, now: Instant) -> PodUsage {
        let mut state = self.shared.state();
        if let Some((at, usage)) = &state.usage
            && now.saturating_duration_since(*at) <= USAGE_MAX_AGE
        {
            return PodUsage::Fresh(usage.clone());
        }
        if !state.usage_wanted {
            state.usage_wanted = true;
            self.shared.wake.notify_one();
        }
        if state.connected && !state.usage_failed {
            PodUsage::Pending
        } else {
            PodUsage::Unavailable
        }
    }
}

#[cfg(test)]
impl RuntimeLink {
    /// A link with no thread behind it, in the state `connected` says.
    pub(crate) fn detached(connected: bool) -> Self {
        let link = Self {
            shared: Arc::new(Shared {
                endpoint: "/detached.sock".into(),
                kubelet_root: PathBuf::new(),
                state: Mutex::new(State::default()),
                filesystems_changed: AtomicU64::new(0),
                wake: Notify::new(),
            }),
        };
        link.shared.state().connected = connected;
        link
    }

    /// What the thread leaves after a reading taken at `at`.
    pub(crate) fn set_reading(
        &self,
        at: Instant,
        paths: FsPaths,
        pods: BTreeMap<String, PodDiskUsage>,
    ) {
        let mut state = self.shared.state();
        state.filesystems = Some((paths, DiskLayout::Shared));
        self.shared
            .filesystems_changed
            .fetch_add(1, Ordering::Release);
        state.usage = Some((at, Arc::new(pods)));
        state.usage_wanted = false;
    }

    pub(crate) fn usage_wanted(&self) -> bool {
        self.shared.state().usage_wanted
    }

    /// The thread's part of a reclaim, without removing anything: takes
    /// the request and finishes it at `at`. What it was asked for.
    pub(crate) fn run_reclaim(&self, at: Instant) -> Option<ReclaimRequest> {
        let request = self.shared.state().reclaims.take()?;
        self.shared.state().reclaims.finish(request.signal, at);
        Some(request)
    }
}

impl Drop for LinkThread {
    fn drop(&mut self) {
        self.shared.state().stopping = true;
        self.shared.wake.notify_one();
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain data behind.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn stopping(&self) -> bool {
        self.state().stopping
    }

    /// Waits `period`, cut short only to stop (work asked for meanwhile is
    /// in the state, and taken after): a decision asking on every close
    /// watch must not turn the back-off into a busy loop. False once the
    /// link must stop.
    async fn pause(&self, period: Duration) -> bool {
        let until = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return !self.stopping(),
                () = self.wake.notified() => if self.stopping() {
                    return false;
                },
            }
        }
    }
}

/// The thread's work: connect (again and again until the runtime answers),
/// learn its filesystems, then read the pods' disk usage whenever a
/// decision asks, until told to stop.
async fn serve(shared: Arc<Shared>, metrics: Arc<Metrics>, mut images: ImageTracker) {
    let Some(mut client) = connect(&shared, &metrics).await else {
        return;
    };
    match client.version().await {
        Ok((name, version)) => info!(
            endpoint = shared.endpoint,
            runtime = name,
            version,
            "container runtime connected"
        ),
        Err(e) => failed(&shared, &metrics, &e),
    }
    // The filesystems at once (one CRI call, no walk): the imagefs and
    // containerfs signals need them before any disk decision.
    learn_filesystems(&shared, &metrics, &mut client).await;
    track_images(&shared, &metrics, &mut client, &mut images).await;
    while !shared.stopping() {
        let request = shared.state().reclaims.take();
        if let Some(request) = request {
            reclaim_node(&shared, &metrics, &mut client, &mut images, &request).await;
            shared
                .state()
                .reclaims
                .finish(request.signal, Instant::now());
        }
        let wanted = std::mem::take(&mut shared.state().usage_wanted);
        if wanted {
            let read = read(&shared, &metrics, &mut client).await;
            track_images(&shared, &metrics, &mut client, &mut images).await;
            if !read && !shared.pause(READ_RETRY).await {
                return;
            }
        }
        let idle = {
            let state = shared.state();
            !state.usage_wanted && !state.reclaims.requested()
        };
        if idle {
            shared.wake.notified().await;
        }
    }
}

/// Records which images containers use now, so that "least recently used"
/// means what it means for kubelet's image GC, which looks every 5 minutes;
/// evictd looks whenever it reads the pods' disk usage and before it
/// removes images.
async fn track_images(
    shared: &Shared,
    metrics: &Metrics,
    client: &mut RuntimeClient,
    tracker: &mut ImageTracker,
) {
    let listed = async {
        let images = client.list_images().await?;
        let containers = client.list_containers().await?;
        Ok::<_, RuntimeError>((images, containers))
    };
    match listed.await {
        Ok((images, containers)) => tracker.observe(&images, &containers, SystemTime::now()),
        Err(e) => failed(shared, metrics, &e),
    }
}

/// kubelet's node reclaim functions for the signal, in order; each removal
/// is logged (by [`reclaim`]) and counted. A failure ends the round: the
/// decision then goes on to evict, as kubelet's does.
async fn reclaim_node(
    shared: &Shared,
    metrics: &Metrics,
    client: &mut RuntimeClient,
    images: &mut ImageTracker,
    request: &ReclaimRequest,
) {
    let live = &request.live_pods;
    for step in request.steps {
        let now = SystemTime::now();
        let removed = match (step, request.dry_run) {
            (ReclaimStep::DeadContainers, false) => {
                reclaim::remove_dead_containers(client, live).await
            }
            (ReclaimStep::DeadContainers, true) => {
                reclaim::would_remove_dead_containers(client, live).await
            }
            (ReclaimStep::UnusedImages, false) => {
                reclaim::remove_unused_images(client, images, now).await
            }
            (ReclaimStep::UnusedImages, true) => {
                reclaim::would_remove_unused_images(client, images, now).await
            }
        };
        match removed {
            Ok(removed) if request.dry_run => {
                for removal in &removed {
                    info!(step = ?step, removal = ?removal, "--dry-run: node reclaim would remove");
                }
            }
            Ok(removed) => {
                for removal in &removed {
                    let kind = match removal {
                        Removal::Container { .. } => "container",
                        Removal::Image { .. } => "image",
                    };
                    metrics
                        .node_reclaim_removals
                        .with_label_values(&[kind])
                        .inc();
                }
                info!(step = ?step, removed = removed.len(), "node reclaim");
            }
            Err(e) => {
                failed(shared, metrics, &e);
                return;
            }
        }
    }
}

async fn learn_filesystems(shared: &Shared, metrics: &Metrics, client: &mut RuntimeClient) {
    match RuntimeFilesystems::observe(client, &shared.kubelet_root).await {
        Ok(filesystems) => remember(shared, &filesystems),
        Err(FilesystemsError::Runtime(e)) => failed(shared, metrics, &e),
        Err(e) => warn!(error = %e, "the container runtime's filesystems"),
    }
}

/// Where the imagefs and containerfs are, logged when first known or
/// changed.
fn remember(shared: &Shared, filesystems: &RuntimeFilesystems) {
    let paths = FsPaths {
        imagefs: filesystems.imagefs.mountpoint.clone(),
        containerfs: filesystems.containerfs.mountpoint.clone(),
    };
    let known = Some((paths, filesystems.layout));
    let mut state = shared.state();
    if state.filesystems != known {
        info!(imagefs = %filesystems.imagefs.mountpoint.display(),
            containerfs = %filesystems.containerfs.mountpoint.display(),
            layout = ?filesystems.layout, "container runtime filesystems");
        state.filesystems = known;
        shared.filesystems_changed.fetch_add(1, Ordering::Release);
    }
}

/// Takes a reading and leaves it for the loop; false when it failed.
async fn read(shared: &Shared, metrics: &Metrics, client: &mut RuntimeClient) -> bool {
    let started = Instant::now();
    match DiskReading::read(client, &shared.kubelet_root).await {
        Ok(reading) => {
            debug!(pods = reading.pods.len(), took = ?started.elapsed(), "pods' disk usage read");
            remember(shared, &reading.filesystems);
            let mut state = shared.state();
            state.usage = Some((started, Arc::new(reading.pods)));
            state.usage_failed = false;
            state.connected = true;
            metrics.container_runtime_connected.set(1);
            true
        }
        Err(e) => {
            match e.runtime() {
                Some(runtime) => failed(shared, metrics, runtime),
                None => warn!(error = %e, "reading the pods' disk usage"),
            }
            shared.state().usage_failed = true;
            false
        }
    }
}

/// Connects, backing off between failures; `None` once the link must stop.
async fn connect(shared: &Shared, metrics: &Metrics) -> Option<RuntimeClient> {
    let mut wait = RECONNECT_FIRST;
    loop {
        if shared.stopping() {
            return None;
        }
        match RuntimeClient::connect(&shared.endpoint).await {
            Ok(client) => {
                shared.state().connected = true;
                metrics.container_runtime_connected.set(1);
                return Some(client);
            }
            Err(e) => {
                failed(shared, metrics, &e);
                warn!(retry_in = ?wait,
                    "without the container runtime, disk evictions are held (the pods' disk usage is unknown); memory and PIDs are protected as usual");
                if !shared.pause(wait).await {
                    return None;
                }
                wait = (wait * 2).min(RECONNECT_MAX);
            }
        }
    }
}

/// Logs and counts a failed CRI call.
fn failed(shared: &Shared, metrics: &Metrics, error: &RuntimeError) {
    warn!(error = %error, "container runtime");
    metrics
        .container_runtime_errors
        .with_label_values(&[error.call()])
        .inc();
    if matches!(
        error,
        RuntimeError::Connect { .. } | RuntimeError::ConnectTimeout { .. }
    ) || matches!(error, RuntimeError::Call { source, .. } if source.code() == tonic::Code::Unavailable)
    {
        shared.state().connected = false;
        metrics.container_runtime_connected.set(0);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn wait_until(deadline: Duration, mut done: impl FnMut() -> bool) {
        let end = Instant::now() + deadline;
        while !done() {
            assert!(Instant::now() < end, "not within {deadline:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn an_absent_runtime_is_counted_and_retried_until_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let metrics = Metrics::new().unwrap();
        let (link, thread) = RuntimeLink::start(
            socket.display().to_string(),
            dir.path().to_owned(),
            metrics.clone(),
            ImageTracker::new(Duration::ZERO),
        )
        .unwrap();
        let errors = || {
            metrics
                .container_runtime_errors
                .with_label_values(&["Connect"])
                .get()
        };
        // Asked for disk usage all the while: the back-off still holds.
        let asked = Instant::now();
        wait_until(Duration::from_secs(10), || {
            let _ = link.pod_usage(Instant::now());
            errors() >= 2
        });
        assert!(
            asked.elapsed() >= RECONNECT_FIRST / 2,
            "connected again {:?} after the first failure",
            asked.elapsed()
        );
        assert_eq!(errors(), 2, "one attempt per back-off, not per request");
        assert!(!link.connected());
        assert_eq!(metrics.container_runtime_connected.get(), 0);
        // A disk decision cannot rank pods on it.
        assert!(matches!(
            link.pod_usage(Instant::now()),
            PodUsage::Unavailable
        ));
        assert!(link.filesystems().is_none());
        drop(thread);
    }

    #[test]
    fn a_reading_serves_decisions_for_its_age_then_a_new_one_is_asked_for() {
        let link = RuntimeLink::detached(true);
        let start = Instant::now();
        assert!(matches!(link.pod_usage(start), PodUsage::Pending));
        assert!(link.usage_wanted());
        let paths = FsPaths {
            imagefs: "/images".into(),
            containerfs: "/images".into(),
        };
        link.set_reading(start, paths.clone(), BTreeMap::new());
        assert_eq!(link.filesystems(), Some(paths));
        assert!(matches!(
            link.pod_usage(start + USAGE_MAX_AGE),
            PodUsage::Fresh(_)
        ));
        assert!(!link.usage_wanted(), "a fresh reading asks for nothing");
        let stale = start + USAGE_MAX_AGE + Duration::from_millis(1);
        assert!(matches!(link.pod_usage(stale), PodUsage::Pending));
        assert!(link.usage_wanted());
    }

    #[test]
    fn node_reclaim_is_asked_for_then_the_node_is_looked_at_again_before_evicting() {
        let start = Instant::now();
        let link = RuntimeLink::detached(true);
        let live = || BTreeSet::from(["uid-a".to_owned()]);
        assert_eq!(
            link.reclaim(Signal::NodeFsAvailable, false, start, BTreeSet::new),
            NodeReclaim::Unavailable,
            "the layout is not known yet"
        );
        let paths = FsPaths {
            imagefs: "/images".into(),
            containerfs: "/images".into(),
        };
        link.set_reading(start, paths, BTreeMap::new());
        assert_eq!(
            link.reclaim(Signal::MemoryAvailable, false, start, BTreeSet::new),
            NodeReclaim::Unavailable
        );
        assert_eq!(
            link.reclaim(Signal::NodeFsAvailable, true, start, live),
            NodeReclaim::Pending
        );
        assert_eq!(
            link.reclaim(Signal::NodeFsAvailable, true, start, live),
            NodeReclaim::Pending,
            "asked for once"
        );
        assert_eq!(
            link.run_reclaim(start),
            Some(ReclaimRequest {
                signal: Signal::NodeFsAvailable,
                steps: &[ReclaimStep::DeadContainers, ReclaimStep::UnusedImages],
                dry_run: true,
                live_pods: live(),
            })
        );
        // Just done: the decision looks at the node again first.
        assert_eq!(
            link.reclaim(Signal::NodeFsAvailable, true, start, live),
            NodeReclaim::Pending
        );
        assert_eq!(link.run_reclaim(start), None, "nothing asked again");
        assert_eq!(
            link.reclaim(Signal::NodeFsAvailable, true, start, live),
            NodeReclaim::Done
        );
        // The next round reclaims again.
        let later = start + USAGE_MAX_AGE + Duration::from_secs(1);
        assert_eq!(
            link.reclaim(Signal::NodeFsAvailable, true, later, live),
            NodeReclaim::Pending
        );
        assert!(link.run_reclaim(later).is_some());
        assert_eq!(
            RuntimeLink::detached(false).reclaim(
                Signal::NodeFsAvailable,
                false,
                start,
                BTreeSet::new
            ),
            NodeReclaim::Unavailable,
            "no runtime, no reclaim"
        );
    }
}
