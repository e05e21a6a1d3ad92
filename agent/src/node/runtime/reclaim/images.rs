//! kubelet's image GC (pkg/kubelet/images/image_gc_manager.go) as node
//! reclaim uses it (`DeleteUnusedImages`): the images no container uses,
//! not pinned, first seen at least `imageMinimumGCAge` ago, least recently
//! used first. Beyond kubelet, which trusts the runtime to pin the image its
//! sandboxes run, no image a sandbox runs is ever removed, whatever the
//! runtime pins or says its sandbox image is.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, SystemTime},
};

use k8s_cri::v1::{Container, Image};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    node::runtime::{RuntimeClient, RuntimeError},
    state::StateDir,
};

/// kubelet's default `imageMinimumGCAge` (`--minimum-image-ttl-duration`):
/// an image just pulled for a container not yet created is left alone.
pub const DEFAULT_MINIMUM_AGE: Duration = Duration::from_secs(2 * 60);

/// When each image was first seen, in the state directory, so that a
/// restarted agent does not take an image pulled a moment ago for an old one.
const FILE: &str = "images-first-seen.json";
/// Bumped when the file's meaning changes; a file of another format is
/// ignored, not misread.
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FirstSeenFile {
    format: u32,
    /// Image id to when it was first seen, in seconds since the epoch.
    first_seen: BTreeMap<String, u64>,
}

/// When kubelet's image manager first saw an image and last saw it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageRecord {
    first_detected: SystemTime,
    /// Never, for an image no container has used since it was first seen
    /// (kubelet's zero time, before every other).
    last_used: Option<SystemTime>,
}

/// kubelet's image GC bookkeeping (`realImageGCManager.detectImages`):
/// each observation records when an image was first seen and the last time
/// a container (running or not) used it. Kept across observations, so
/// "least recently used" means what it means for kubelet; first sightings
/// are kept across restarts too when the tracker has a state directory.
#[derive(Debug)]
pub struct ImageTracker {
    records: HashMap<String, ImageRecord>,
    minimum_age: Duration,
    state: Option<StateDir>,
    /// Images were first seen or forgotten since the file was written.
    unsaved: bool,
}

impl ImageTracker {
    /// A tracker that keeps nothing across restarts.
    pub fn new(minimum_age: Duration) -> Self {
        Self {
            records: HashMap::new(),
            minimum_age,
            state: None,
            unsaved: false,
        }
    }

    /// A tracker that keeps first sightings in `state`, starting from what
    /// a previous agent left there. A file that cannot be used is a warning
    /// (set aside when unreadable): every image is then first seen now,
    /// which only delays its removal.
    pub fn persisted(minimum_age: Duration, state: StateDir) -> Self {
        let mut tracker = Self::new(minimum_age);
        match load(&state) {
            Ok(first_seen) => {
                if !first_seen.is_empty() {
                    info!(
                        images = first_seen.len(),
                        "when images were first seen, from the last agent"
                    );
                }
                tracker.records = first_seen
                    .into_iter()
                    .map(|(id, first_detected)| {
                        let record = ImageRecord {
                            first_detected,
                            last_used: None,
                        };
                        (id, record)
                    })
                    .collect();
            }
            Err(error) => match state.set_aside(FILE) {
                Ok(kept) => warn!(error, kept = %kept.display(),
                    "the images' first sightings cannot be read; set aside, every image is new"),
                Err(e) => warn!(error, set_aside = %e,
                    "the images' first sightings cannot be read; every image is new"),
            },
        }
        tracker.state = Some(state);
        tracker
    }

    /// Records `images` as seen at `now`, those used by `containers` as used
    /// now; forgets images that are gone. Writes the first sightings when
    /// they changed.
    pub fn observe(&mut self, images: &[Image], containers: &[Container], now: SystemTime) {
        let in_use = images_in_use(images, containers, &SandboxImages::default());
        let before = self.records.len();
        self.records
            .retain(|id, _| images.iter().any(|i| i.id == *id));
        let mut changed = self.records.len() != before;
        for image in images {
            let record = self.records.entry(image.id.clone()).or_insert_with(|| {
                changed = true;
                ImageRecord {
                    first_detected: now,
                    last_used: None,
                }
            });
            if in_use.contains(image.id.as_str()) {
                record.last_used = Some(now);
            }
        }
        self.unsaved |= changed;
        self.save();
    }

    /// The images kubelet's `DeleteUnusedImages` would delete at `now`, in
    /// its order (`byLastUsedAndDetected`: least recently used first, then
    /// first detected): used by no container, not pinned, first seen at
    /// least the minimum age ago (`freeSpace`), and run by no sandbox.
    /// None while some sandbox's image is unknown: any image might be it.
    /// Call [`observe`](Self::observe) with the same lists first.
    pub fn unused<'a>(
        &self,
        images: &'a [Image],
        containers: &[Container],
        sandboxes: &SandboxImages,
        now: SystemTime,
    ) -> Vec<&'a Image> {
        if sandboxes.unnamed > 0 {
            warn!(
                sandboxes = sandboxes.unnamed,
                "the runtime does not say which image some sandboxes run: no image is removed"
            );
            return Vec::new();
        }
        let in_use = images_in_use(images, containers, sandboxes);
        let old_enough = |record: &ImageRecord| {
            now.duration_since(record.first_detected)
                .is_ok_and(|age| age >= self.minimum_age)
        };
        let mut unused: Vec<(&Image, ImageRecord)> = images
            .iter()
            .filter(|image| !image.pinned && !in_use.contains(image.id.as_str()))
            .filter_map(|image| Some((image, *self.records.get(&image.id)?)))
            .filter(|(_, record)| old_enough(record))
            .collect();
        unused.sort_by_key(|(image, record)| (record.last_used, record.first_detected, &image.id));
        unused.into_iter().map(|(image, _)| image).collect()
    }

    /// Writes the first sightings if they changed since the last write. A
    /// failure is a warning, tried again at the next change.
    fn save(&mut self) {
        let Some(state) = self.state.as_ref().filter(|_| self.unsaved) else {
            return;
        };
        let first_seen = self
            .records
            .iter()
            .map(|(id, record)| {
                let seconds = record
                    .first_detected
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs());
                (id.clone(), seconds)
            })
            .collect();
        let file = FirstSeenFile {
            format: FORMAT,
            first_seen,
        };
        let written = serde_json::to_vec(&file)
            .map_err(|e| e.to_string())
            .and_then(|bytes| state.write(FILE, &bytes).map_err(|e| e.to_string()));
        match written {
            Ok(()) => self.unsaved = false,
            Err(error) => warn!(
                error,
                "the images' first sightings not written; a restart would take the newer ones for new"
            ),
        }
    }
}

/// The first sightings a previous agent wrote; none when there is no file
/// or it is of another format. An error when it cannot be read.
fn load(state: &StateDir) -> Result<BTreeMap<String, SystemTime>, String> {
    let Some(bytes) = state.read(FILE).map_err(|e| e.to_string())? else {
        return Ok(BTreeMap::new());
    };
    let file: FirstSeenFile = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if file.format != FORMAT {
        warn!(
            format = file.format,
            "the images' first sightings are of another format; not used"
        );
        return Ok(BTreeMap::new());
    }
    // A time past what the clock holds (a corrupt or forged file) is left
    // out: that image is first seen now, which only delays its removal.
    Ok(file
        .first_seen
        .into_iter()
        .filter_map(|(id, seconds)| {
            let first_seen = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds))?;
            Some((id, first_seen))
        })
        .collect())
}

/// The images the runtime's sandboxes run, which are never removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxImages {
    /// What the runtime starts sandboxes from now (containerd's
    /// `sandbox_image`), when it says.
    pub configured: Option<String>,
    /// What each sandbox, ready or not, runs, by its verbose status.
    pub running: Vec<String>,
    /// Sandboxes whose status names no image.
    pub unnamed: usize,
}

impl SandboxImages {
    /// Asks the runtime: its configuration, and every sandbox's status. A
    /// sandbox removed meanwhile is none.
    pub async fn ask(client: &mut RuntimeClient) -> Result<Self, RuntimeError> {
        let mut images = Self {
            configured: client.sandbox_image().await?,
            ..Self::default()
        };
        for sandbox in client.list_pod_sandboxes().await? {
            match client.pod_sandbox_image(&sandbox.id).await {
                Ok(Some(image)) => images.running.push(image),
                Ok(None) => images.unnamed += 1,
                Err(RuntimeError::Call { source, .. })
                    if source.code() == tonic::Code::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(images)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.configured
            .iter()
            .chain(&self.running)
            .map(String::as_str)
    }
}

/// Every name an image answers to: id, tags, digests.
fn names(image: &Image) -> impl Iterator<Item = &str> {
    std::iter::once(image.id.as_str())
        .chain(image.repo_tags.iter().map(String::as_str))
        .chain(image.repo_digests.iter().map(String::as_str))
}

/// Ids of the images some container or sandbox uses, matched by any of
/// their names (containerd's `image_ref` is the id; other runtimes give a
/// digest; a sandbox's image is the name it was started from).
fn images_in_use<'a>(
    images: &'a [Image],
    containers: &[Container],
    sandboxes: &SandboxImages,
) -> HashSet<&'a str> {
    let referenced: HashSet<&str> = containers
        .iter()
        .flat_map(|c| {
            [
                c.image_ref.as_str(),
                c.image_id.as_str(),
                c.image.as_ref().map_or("", |i| i.image.as_str()),
            ]
        })
        .chain(sandboxes.names())
        .filter(|name| !name.is_empty())
        .collect();
    images
        .iter()
        .filter(|image| names(image).any(|name| referenced.contains(name)))
        .map(|image| image.id.as_str())
        .collect()
}
