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
//! it ([`RuntimeLink::pod_usage`]), and then kept for [`USAGE_MAX_AGE`]
//! from when it was finished. Walking every pod's logs and volumes on each
//! memory event would cost the memory path what evictd exists to save; a
//! disk signal moves slowly, and the writable layers' sizes the runtime
//! reports are themselves refreshed only every 10 s.
//!
//! A reading that takes longer than that window is late: said once (a
//! warning, `evictd_disk_usage_readings_late_total`), and meanwhile the
//! last reading serves, up to [`STALE_MAX_AGE`] old, as kubelet decides on
//! volume figures its background walks refresh once a minute. Pods a
//! reading could not walk whole are said once each too.
//!
//! Node-level reclaim (kubelet's `reclaimNodeLevelResources`) runs here
//! too, when a disk decision asks ([`RuntimeLink::reclaim`]), one round per
//! signal: dead containers and unused images are removed, and the decision
//! looks at the node again before it evicts anyone.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{Notify, oneshot};
use tracing::{debug, info, warn};

pub(crate) use super::reclaim::NodeReclaim;
use super::{
    RuntimeClient, RuntimeError,
    disk_usage::{Incomplete, PodDiskUsage},
    filesystems::{DiskLayout, FilesystemsError, RuntimeFilesystems},
    reading::{DiskReading, FsPaths},
    reclaim::{self, ImageTracker, ReclaimRequest, ReclaimRounds, ReclaimStep, Removal},
};
use crate::{decide::thresholds::Signal, logs, metrics::Metrics};

/// How old the pods' disk usage may be for a decision: containerd's
/// `stats_collect_period` (10 s by default), how often it measures the
/// writable layers, and kubelet's housekeeping period, at which kubelet's
/// own eviction manager sees disk usage.
pub(crate) const USAGE_MAX_AGE: Duration = Duration::from_secs(10);
/// How old (since it finished) the last reading may be to serve while the
/// next is late: kubelet's `--volume-stats-agg-period` (1 minute), how old
/// the volume figures kubelet's own eviction manager decides on may be.
pub const STALE_MAX_AGE: Duration = Duration::from_secs(60);
/// While a decision waits for a reading: how often it looks for the first
/// second (most readings take milliseconds), then from then on.
const WAIT_FIRST: Duration = Duration::from_millis(100);
const WAIT_LONG: Duration = Duration::from_secs(1);
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
pub(crate) struct RuntimeLink {
    shared: Arc<Shared>,
}

/// Stops the link's thread when dropped (at the agent's shutdown).
pub(crate) struct LinkThread {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: String,
    /// kubelet's root directory (`--nodefs-path`): nodefs, and the pods'
    /// volumes below `pods/`.
    kubelet_root: PathBuf,
    state: Mutex<LinkState>,
    metrics: Arc<Metrics>,
    /// Bumped whenever the filesystems change, so that the loop's every
    /// observation costs one atomic load, not a lock and a copy.
    filesystems_changed: AtomicU64,
    /// Wakes the thread: work was asked for, or it must stop.
    wake: Notify,
}

#[derive(Debug, Default)]
struct LinkState {
    /// Whether the runtime answered the last call.
    connected: bool,
    stopping: bool,
    /// Where the runtime last said its filesystems are, and their layout.
    filesystems: Option<(FsPaths, DiskLayout)>,
    /// The last reading of the pods' disk usage.
    usage: Option<DiskUsageReading>,
    /// A decision waits for a fresh reading.
    usage_wanted: bool,
    /// When the reading under way began, if one is.
    reading_since: Option<Instant>,
    /// The reading under way was found late, and said so.
    late_told: bool,
    /// The last reading failed.
    usage_failed: bool,
    reclaims: ReclaimRounds,
    /// Pods (by uid) whose sandbox ids a soft eviction waits for.
    sandbox_requests: Vec<(String, oneshot::Sender<Option<Vec<String>>>)>,
}

/// One reading of the pods' disk usage, by pod uid, and when it was taken.
#[derive(Debug)]
struct DiskUsageReading {
    finished: Instant,
    pods: Arc<BTreeMap<String, PodDiskUsage>>,
}

/// The pods' disk usage as a decision can have it now.
#[derive(Debug, Clone)]
pub(crate) enum DiskUsageAnswer {
    /// Finished within [`USAGE_MAX_AGE`], or within [`STALE_MAX_AGE`] while
    /// the next reading is late; by pod uid.
    Fresh(Arc<BTreeMap<String, PodDiskUsage>>),
    /// Being read: decide once it is there, looking again after `wait`.
    Pending { wait: Duration },
    /// The runtime is down or the last reading failed: the disk decision
    /// is held until a reading comes (one is asked for).
    Unavailable,
}

impl RuntimeLink {
    /// Starts the thread, which connects at once; `kubelet_root` is
    /// `--nodefs-path`, and `images` what node reclaim knows of the images.
    pub(crate) fn start(
        endpoint: String,
        kubelet_root: PathBuf,
        metrics: Arc<Metrics>,
        images: ImageTracker,
    ) -> Result<(Self, LinkThread), LinkError> {
        let shared = Arc::new(Shared {
            endpoint,
            kubelet_root,
            state: Mutex::new(LinkState::default()),
            metrics: metrics.clone(),
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
    #[cfg(test)]
    pub(crate) fn connected(&self) -> bool {
        self.shared.state().connected
    }

    /// Where the imagefs and containerfs signals are measured, once the
    /// runtime has said.
    pub(crate) fn filesystems(&self) -> Option<FsPaths> {
        self.shared
            .state()
            .filesystems
            .as_ref()
            .map(|(paths, _)| paths.clone())
    }

    /// How many times the filesystems have changed: call
    /// [`filesystems`](Self::filesystems) again only when this moves.
    pub(crate) fn filesystems_version(&self) -> u64 {
        self.shared.filesystems_changed.load(Ordering::Acquire)
    }

    /// Node-level reclaim before a decision for `signal` at `now`: asks the
    /// thread for a round of the signal's steps when none was done for it
    /// in the last [`USAGE_MAX_AGE`] (kubelet reclaims on every synchronize
    /// round under pressure, every 10 s). With `dry_run` the thread only
    /// logs what it would remove; `live_pods` (asked only for a new round,
    /// without the lock the thread takes) are the pods alive whose newest
    /// dead containers stay.
    pub(crate) fn reclaim(
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

    /// The ids of pod `uid`'s sandboxes, as the runtime lists them now,
    /// answered by the thread between its other work; `None` when the
    /// runtime is down or fails to answer.
    pub(crate) fn pod_sandboxes(
        &self,
        uid: &str,
    ) -> impl Future<Output = Option<Vec<String>>> + 'static {
        let (reply, answer) = oneshot::channel();
        let asked = {
            let mut state = self.shared.state();
            state.connected && {
                state.sandbox_requests.push((uid.to_owned(), reply));
                true
            }
        };
        if asked {
            self.shared.wake.notify_one();
        }
        async move {
            if !asked {
                return None;
            }
            answer.await.ok().flatten()
        }
    }

    /// Pod `uid`'s disk usage in the last reading, however old: what the
    /// decision that just ranked it saw.
    pub(crate) fn last_pod_usage(&self, uid: &str) -> Option<PodDiskUsage> {
        self.shared
            .state()
            .usage
            .as_ref()
            .and_then(|reading| reading.pods.get(uid).cloned())
    }

    /// The pods' disk usage for a decision at `now`; asks the thread for a
    /// fresh reading when the last finished more than [`USAGE_MAX_AGE`]
    /// ago. A reading under way past that window is late: said once, and
    /// the last one serves meanwhile while it is at most [`STALE_MAX_AGE`]
    /// old.
    pub(crate) fn pod_usage(&self, now: Instant) -> DiskUsageAnswer {
        let mut state = self.shared.state();
        let age = |reading: &DiskUsageReading| now.saturating_duration_since(reading.finished);
        if let Some(reading) = &state.usage
            && age(reading) <= USAGE_MAX_AGE
        {
            return DiskUsageAnswer::Fresh(reading.pods.clone());
        }
        let Some(since) = state.reading_since else {
            if !state.usage_wanted {
                state.usage_wanted = true;
                self.shared.wake.notify_one();
            }
            return if state.connected && !state.usage_failed {
                DiskUsageAnswer::Pending { wait: WAIT_FIRST }
            } else {
                DiskUsageAnswer::Unavailable
            };
        };
        let under_way = now.saturating_duration_since(since);
        if under_way > USAGE_MAX_AGE {
            self.shared.late(&mut state, under_way);
            if let Some(reading) = &state.usage
                && age(reading) <= STALE_MAX_AGE
            {
                return DiskUsageAnswer::Fresh(reading.pods.clone());
            }
        }
        DiskUsageAnswer::Pending {
            wait: if under_way < WAIT_LONG {
                WAIT_FIRST
            } else {
                WAIT_LONG
            },
        }
    }
}

#[cfg(test)]
impl RuntimeLink {
    /// A link with no thread behind it, in the state `connected` says.
    pub(crate) fn detached(connected: bool) -> Self {
        Self::detached_with(connected, Metrics::new().unwrap())
    }

    pub(crate) fn detached_with(connected: bool, metrics: Arc<Metrics>) -> Self {
        let link = Self {
            shared: Arc::new(Shared {
                endpoint: "/detached.sock".into(),
                kubelet_root: PathBuf::new(),
                state: Mutex::new(LinkState::default()),
                metrics,
                filesystems_changed: AtomicU64::new(0),
                wake: Notify::new(),
            }),
        };
        link.shared.state().connected = connected;
        link
    }

    /// What the thread leaves after a reading finished at `at`.
    pub(crate) fn set_reading(
        &self,
        at: Instant,
        paths: FsPaths,
        pods: BTreeMap<String, PodDiskUsage>,
    ) {
        self.shared.state().filesystems = Some((paths, DiskLayout::Shared));
        self.shared
            .filesystems_changed
            .fetch_add(1, Ordering::Release);
        self.shared.begin_reading(at);
        self.shared.land_reading(at, at, pods);
    }

    /// The thread's part of a reading: takes the request at `at`.
    pub(crate) fn begin_reading(&self, at: Instant) -> bool {
        self.shared.begin_reading(at)
    }

    /// The thread's part of a reading begun at `started`: it lands at
    /// `finished`.
    pub(crate) fn land_reading(
        &self,
        started: Instant,
        finished: Instant,
        pods: BTreeMap<String, PodDiskUsage>,
    ) {
        self.shared.land_reading(started, finished, pods);
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
    /// Whether the runtime answers, kept and exported by endpoint: a node
    /// without --container-runtime-endpoint has no series to alert on.
    fn set_connected(&self, connected: bool) {
        self.state().connected = connected;
        self.metrics
            .container_runtime_connected
            .with_label_values(&[&self.endpoint])
            .set(i64::from(connected));
    }

    fn state(&self) -> MutexGuard<'_, LinkState> {
        // A panic elsewhere while holding the lock leaves plain data behind.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn stopping(&self) -> bool {
        self.state().stopping
    }

    /// Takes a decision's request for a reading, begun at `at`; false when
    /// none was asked for.
    fn begin_reading(&self, at: Instant) -> bool {
        let mut state = self.state();
        if !std::mem::take(&mut state.usage_wanted) {
            return false;
        }
        state.reading_since = Some(at);
        state.late_told = false;
        true
    }

    /// A reading begun at `started` landed at `finished`: it serves for
    /// [`USAGE_MAX_AGE`] from now, however long it took.
    fn land_reading(
        &self,
        started: Instant,
        finished: Instant,
        pods: BTreeMap<String, PodDiskUsage>,
    ) {
        let took = finished.saturating_duration_since(started);
        self.metrics.disk_usage_reading.observe(took.as_secs_f64());
        let mut state = self.state();
        if took > USAGE_MAX_AGE {
            self.late(&mut state, took);
            info!(took = ?took, pods = pods.len(), "late reading of the pods' disk usage finished: it serves from now");
        }
        state.usage = Some(DiskUsageReading {
            finished,
            pods: Arc::new(pods),
        });
        state.reading_since = None;
        state.usage_failed = false;
    }

    /// The reading under way has taken `under_way` so far, past its window:
    /// said and counted once.
    fn late(&self, state: &mut LinkState, under_way: Duration) {
        if std::mem::replace(&mut state.late_told, true) {
            return;
        }
        self.metrics.disk_usage_readings_late.inc();
        let serving = state
            .usage
            .as_ref()
            .map(|reading| reading.finished.elapsed());
        warn!(under_way = ?under_way, window = ?USAGE_MAX_AGE, last_reading_age = ?serving,
            "the pods' disk usage reading is late: disk decisions use the last reading while it is at most a minute old, and wait for this one after that");
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
    let mut incomplete = IncompletePods::default();
    while !shared.stopping() {
        answer_sandbox_requests(&shared, &metrics, &mut client).await;
        let request = shared.state().reclaims.take();
        if let Some(request) = request {
            reclaim_node(&shared, &metrics, &mut client, &mut images, &request).await;
            shared
                .state()
                .reclaims
                .finish(request.signal, Instant::now());
        }
        let started = Instant::now();
        if shared.begin_reading(started) {
            let read = read(&shared, &metrics, &mut client, started, &mut incomplete).await;
            track_images(&shared, &metrics, &mut client, &mut images).await;
            if !read && !shared.pause(READ_RETRY).await {
                return;
            }
        }
        let idle = {
            let state = shared.state();
            !state.usage_wanted && !state.reclaims.requested() && state.sandbox_requests.is_empty()
        };
        if idle {
            shared.wake.notified().await;
        }
    }
}

/// Tells each soft eviction waiting which sandboxes its pod has: one
/// listing for all of them.
async fn answer_sandbox_requests(shared: &Shared, metrics: &Metrics, client: &mut RuntimeClient) {
    let requests = std::mem::take(&mut shared.state().sandbox_requests);
    if requests.is_empty() {
        return;
    }
    let sandboxes = match client.list_pod_sandboxes().await {
        Ok(sandboxes) => Some(sandboxes),
        Err(e) => {
            failed(shared, metrics, &e);
            None
        }
    };
    for (uid, reply) in requests {
        let ids = sandboxes.as_ref().map(|sandboxes| {
            sandboxes
                .iter()
                .filter(|sandbox| sandbox.metadata.as_ref().is_some_and(|m| m.uid == uid))
                .map(|sandbox| sandbox.id.clone())
                .collect()
        });
        // The eviction may have stopped waiting.
        let _ = reply.send(ids);
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

/// Takes a reading begun at `started` and leaves it for the loop; false
/// when it failed.
async fn read(
    shared: &Shared,
    metrics: &Metrics,
    client: &mut RuntimeClient,
    started: Instant,
    incomplete: &mut IncompletePods,
) -> bool {
    match DiskReading::read(client, &shared.kubelet_root).await {
        Ok(reading) => {
            let finished = Instant::now();
            debug!(pods = reading.pods.len(), took = ?finished.duration_since(started), "pods' disk usage read");
            remember(shared, &reading.filesystems);
            incomplete.tell(&reading.pods, metrics);
            shared.land_reading(started, finished, reading.pods);
            shared.set_connected(true);
            true
        }
        Err(e) => {
            match e.runtime() {
                Some(runtime) => failed(shared, metrics, runtime),
                None => warn!(error = %e, "reading the pods' disk usage"),
            }
            let mut state = shared.state();
            state.usage_failed = true;
            state.reading_since = None;
            false
        }
    }
}

/// The pods the last reading could not walk whole, and why: each is said
/// once when it becomes so (and once when it is measured whole again), and
/// counted by reason in `evictd_pods_disk_usage_incomplete`.
#[derive(Debug, Default)]
struct IncompletePods {
    told: HashMap<String, Incomplete>,
}

impl IncompletePods {
    fn tell(&mut self, pods: &BTreeMap<String, PodDiskUsage>, metrics: &Metrics) {
        let mut now = HashMap::new();
        for (uid, pod) in pods {
            let Some(incomplete) = &pod.incomplete else {
                if self.told.contains_key(uid) {
                    info!(pod = %format!("{}/{}", pod.namespace, pod.name),
                        "pod's logs and volumes measured whole again");
                }
                continue;
            };
            let shortfall = &incomplete.shortfall;
            if self.told.get(uid) != Some(&shortfall.reason) {
                warn!(pod = %format!("{}/{}", pod.namespace, pod.name),
                    reason = shortfall.reason.as_str(), path = %shortfall.path.display(),
                    error = shortfall.error.as_deref().unwrap_or_default(),
                    ephemeral_storage_bytes_seen = logs::bytes(pod.ephemeral_storage_bytes()).logged(),
                    "pod's logs and volumes not measured whole: its disk usage is at least what was seen; it ranks first for disk, and is held to any local-storage limit it sets as over it (unless only time cut the walk short)");
            }
            now.insert(uid.clone(), shortfall.reason);
        }
        for reason in Incomplete::ALL {
            let pods = now.values().filter(|r| **r == reason).count();
            metrics
                .pods_disk_usage_incomplete
                .with_label_values(&[reason.as_str()])
                .set(i64::try_from(pods).unwrap_or(i64::MAX));
        }
        self.told = now;
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
                shared.set_connected(true);
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
        shared.set_connected(false);
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
        assert_eq!(
            metrics
                .container_runtime_connected
                .with_label_values(&["/detached.sock"])
                .get(),
            0
        );
        // A disk decision cannot rank pods on it.
        assert!(matches!(
            link.pod_usage(Instant::now()),
            DiskUsageAnswer::Unavailable
        ));
        assert!(link.filesystems().is_none());
        drop(thread);
    }

    #[test]
    fn a_reading_serves_decisions_for_its_age_then_a_new_one_is_asked_for() {
        let link = RuntimeLink::detached(true);
        let start = Instant::now();
        assert!(matches!(
            link.pod_usage(start),
            DiskUsageAnswer::Pending { wait: WAIT_FIRST }
        ));
        assert!(link.usage_wanted());
        let paths = FsPaths {
            imagefs: "/images".into(),
            containerfs: "/images".into(),
        };
        link.set_reading(start, paths.clone(), BTreeMap::new());
        assert_eq!(link.filesystems(), Some(paths));
        assert!(matches!(
            link.pod_usage(start + USAGE_MAX_AGE),
            DiskUsageAnswer::Fresh(_)
        ));
        assert!(!link.usage_wanted(), "a fresh reading asks for nothing");
        let stale = start + USAGE_MAX_AGE + Duration::from_millis(1);
        assert!(matches!(
            link.pod_usage(stale),
            DiskUsageAnswer::Pending { .. }
        ));
        assert!(link.usage_wanted());
    }

    fn reading_of(uid: &str) -> BTreeMap<String, PodDiskUsage> {
        BTreeMap::from([(uid.to_owned(), PodDiskUsage::default())])
    }

    fn served(usage: DiskUsageAnswer) -> Option<Vec<String>> {
        match usage {
            DiskUsageAnswer::Fresh(pods) => Some(pods.keys().cloned().collect()),
            _ => None,
        }
    }

    #[test]
    fn a_slow_reading_serves_from_when_it_lands_and_a_late_one_is_said_once() {
        let metrics = Metrics::new().unwrap();
        let link = RuntimeLink::detached_with(true, metrics.clone());
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert!(matches!(
            link.pod_usage(start),
            DiskUsageAnswer::Pending { .. }
        ));
        // The first reading takes 30 s, three times its window: it still
        // serves for the window from when it lands.
        assert!(link.begin_reading(start));
        assert!(!link.begin_reading(start), "one reading per request");
        // A decision waiting on it looks again once a second after the
        // first, not every 100 ms.
        assert!(matches!(
            link.pod_usage(start + Duration::from_millis(500)),
            DiskUsageAnswer::Pending { wait: WAIT_FIRST }
        ));
        assert!(matches!(
            link.pod_usage(at(5)),
            DiskUsageAnswer::Pending { wait: WAIT_LONG }
        ));
        assert!(
            !link.usage_wanted(),
            "no second reading asked for meanwhile"
        );
        // Late, with nothing older to serve: said once, still waited for.
        assert!(matches!(
            link.pod_usage(at(11)),
            DiskUsageAnswer::Pending { .. }
        ));
        assert!(matches!(
            link.pod_usage(at(12)),
            DiskUsageAnswer::Pending { .. }
        ));
        assert_eq!(metrics.disk_usage_readings_late.get(), 1);
        link.land_reading(start, at(30), reading_of("first"));
        assert_eq!(metrics.disk_usage_readings_late.get(), 1, "counted once");
        assert_eq!(served(link.pod_usage(at(40))), Some(vec!["first".into()]));
        // The next reading is late too: the last one serves meanwhile, up
        // to a minute after it landed, then the decision waits again.
        assert!(matches!(
            link.pod_usage(at(41)),
            DiskUsageAnswer::Pending { .. }
        ));
        assert!(link.begin_reading(at(41)));
        assert!(matches!(
            link.pod_usage(at(45)),
            DiskUsageAnswer::Pending { .. }
        ));
        assert_eq!(served(link.pod_usage(at(52))), Some(vec!["first".into()]));
        assert_eq!(metrics.disk_usage_readings_late.get(), 2);
        assert_eq!(served(link.pod_usage(at(90))), Some(vec!["first".into()]));
        assert!(matches!(
            link.pod_usage(at(91)),
            DiskUsageAnswer::Pending { .. }
        ));
        link.land_reading(at(41), at(95), reading_of("second"));
        assert_eq!(served(link.pod_usage(at(96))), Some(vec!["second".into()]));
        assert_eq!(metrics.disk_usage_readings_late.get(), 2);
        assert_eq!(metrics.disk_usage_reading.get_sample_count(), 2);
    }

    #[test]
    fn a_pod_not_walked_whole_is_said_once_and_counted_by_reason() {
        use crate::{
            node::runtime::disk_usage::{IncompleteUsage, Shortfall},
            testing::LogCapture,
        };

        let metrics = Metrics::new().unwrap();
        let hidden = |reason| PodDiskUsage {
            namespace: "shop".into(),
            name: "db".into(),
            incomplete: Some(IncompleteUsage {
                shortfall: Shortfall {
                    reason,
                    path: "/var/lib/kubelet/pods/db/volumes/kubernetes.io~empty-dir/data/pg".into(),
                    error: Some("Permission denied (os error 13)".into()),
                },
                volumes: vec![("kubernetes.io~empty-dir".into(), "data".into())],
            }),
            ..PodDiskUsage::default()
        };
        let whole = PodDiskUsage {
            namespace: "shop".into(),
            name: "db".into(),
            ..PodDiskUsage::default()
        };
        let gauge = |reason: &str| {
            metrics
                .pods_disk_usage_incomplete
                .with_label_values(&[reason])
                .get()
        };
        let (log, _guard) = LogCapture::start();
        let mut incomplete = IncompletePods::default();
        for _ in 0..3 {
            incomplete.tell(
                &BTreeMap::from([("db".into(), hidden(Incomplete::Unreadable))]),
                &metrics,
            );
        }
        assert_eq!((gauge("unreadable"), gauge("entries")), (1, 0));
        incomplete.tell(
            &BTreeMap::from([("db".into(), hidden(Incomplete::Entries))]),
            &metrics,
        );
        assert_eq!((gauge("unreadable"), gauge("entries")), (0, 1));
        incomplete.tell(&BTreeMap::from([("db".into(), whole.clone())]), &metrics);
        incomplete.tell(&BTreeMap::from([("db".into(), whole)]), &metrics);
        assert_eq!((gauge("unreadable"), gauge("entries")), (0, 0));
        let lines = log.lines();
        let said = |text: &str| lines.iter().filter(|line| line.contains(text)).count();
        // Once per reason it becomes so, once when whole again.
        assert_eq!(said("not measured whole"), 2, "{lines:#?}");
        assert_eq!(said("reason=\"unreadable\""), 1, "{lines:#?}");
        assert!(
            lines
                .iter()
                .any(|line| line.contains("pod=shop/db") && line.contains("/data/pg"))
        );
        assert_eq!(said("measured whole again"), 1, "{lines:#?}");
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
