use std::time::{Duration, SystemTime};

use k8s_cri::v1::Image;

use super::*;
use crate::{
    node::runtime::fixtures::{self, on_image},
    state::StateDir,
};

fn sandbox(id: &str, ready: bool) -> PodSandbox {
    fixtures::sandbox(id, &format!("uid-{id}"), ready, 0)
}

fn container(
    id: &str,
    sandbox: &str,
    name: &str,
    exited: bool,
    created_at: i64,
    image: &str,
) -> Container {
    let state = if exited {
        ContainerState::ContainerExited
    } else {
        ContainerState::ContainerRunning
    };
    on_image(
        fixtures::container(id, sandbox, name, state, created_at),
        image,
    )
}

fn image(id: &str, tag: &str) -> Image {
    Image {
        id: id.into(),
        repo_tags: vec![tag.into()],
        size: 1000,
        ..Image::default()
    }
}

fn ids(containers: &[&Container]) -> Vec<String> {
    containers.iter().map(|c| c.id.clone()).collect()
}

#[test]
fn each_signal_reclaims_what_frees_its_filesystem() {
    use DiskLayout::*;
    use ReclaimStep::*;
    assert!(steps_for(Signal::MemoryAvailable, Shared).is_empty());
    assert!(steps_for(Signal::PidAvailable, DedicatedImageFs).is_empty());
    for signal in [
        Signal::NodeFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
    ] {
        assert_eq!(steps_for(signal, Shared), [DeadContainers, UnusedImages]);
    }
    assert!(steps_for(Signal::NodeFsAvailable, DedicatedImageFs).is_empty());
    assert_eq!(
        steps_for(Signal::ImageFsAvailable, DedicatedImageFs),
        [DeadContainers, UnusedImages]
    );
    assert_eq!(
        steps_for(Signal::ContainerFsAvailable, DedicatedImageFs),
        [DeadContainers, UnusedImages]
    );
    assert_eq!(
        steps_for(Signal::ImageFsAvailable, SplitImageFs),
        [UnusedImages]
    );
    assert_eq!(
        steps_for(Signal::NodeFsInodesFree, SplitImageFs),
        [DeadContainers]
    );
    assert_eq!(
        steps_for(Signal::ContainerFsAvailable, SplitImageFs),
        [DeadContainers]
    );
}

#[test]
fn dead_containers_keep_the_newest_instance_of_a_live_pod() {
    let sandboxes = [sandbox("live", true), sandbox("gone", false)];
    let containers = [
        container("run", "live", "app", false, 5, "img"),
        container("app-1", "live", "app", true, 1, "img"),
        container("app-2", "live", "app", true, 2, "img"),
        container("job-1", "live", "job", true, 3, "img"),
        container("old-1", "gone", "app", true, 0, "img"),
        container("old-2", "gone", "app", true, 4, "img"),
    ];
    let dead = dead_containers(&sandboxes, &containers, &BTreeSet::new());
    // app-2 and job-1 stay for `logs --previous`; the gone pod loses all.
    assert_eq!(ids(&dead), ["old-1", "app-1", "old-2"]);
}

/// kubelet's evict units are (pod uid, container name), not sandboxes: a
/// live pod whose sandbox was recreated keeps the last container of each
/// name, whichever sandbox it ran in.
#[test]
fn a_pod_whose_sandbox_was_recreated_keeps_its_last_container_of_each_name() {
    let uid = "uid-web";
    let sandboxes = [
        fixtures::sandbox("first", uid, false, 0),
        fixtures::sandbox("second", uid, true, 10),
    ];
    let containers = [
        container("app-0", "first", "app", true, 1, "img"),
        container("app-1", "first", "app", true, 2, "img"),
        container("init-0", "first", "init", true, 0, "img"),
        // The new sandbox's app crashed too; init has not run there yet.
        container("app-2", "second", "app", true, 11, "img"),
    ];
    let dead = dead_containers(&sandboxes, &containers, &BTreeSet::new());
    assert_eq!(ids(&dead), ["app-0", "app-1"]);
    // Its sandbox down while kubelet makes the next: alive while its
    // cgroup is there (`live_pods`).
    let down = [
        fixtures::sandbox("first", uid, false, 0),
        fixtures::sandbox("second", uid, false, 10),
    ];
    let live = BTreeSet::from([uid.to_owned()]);
    assert_eq!(
        ids(&dead_containers(&down, &containers, &live)),
        ["app-0", "app-1"]
    );
    // Gone from everywhere: every unit goes whole.
    assert_eq!(
        ids(&dead_containers(&down, &containers, &BTreeSet::new())),
        ["init-0", "app-0", "app-1", "app-2"]
    );
}

#[test]
fn a_container_is_grouped_by_the_pod_uid_kubelet_labelled_it_with() {
    let sandboxes = [sandbox("s", true)];
    let mut labelled = container("other-0", "s", "app", true, 1, "img");
    labelled
        .labels
        .insert(POD_UID_LABEL.into(), "uid-elsewhere".into());
    let containers = [labelled, container("mine-0", "s", "app", true, 2, "img")];
    // Two units of one container each: the sandbox's pod keeps its own,
    // the labelled pod is not alive and loses it.
    assert_eq!(
        ids(&dead_containers(&sandboxes, &containers, &BTreeSet::new())),
        ["other-0"]
    );
}

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
}

fn sandboxes_run(names: &[&str]) -> SandboxImages {
    SandboxImages {
        running: names.iter().map(|n| (*n).to_owned()).collect(),
        ..SandboxImages::default()
    }
}

fn unused_ids(
    tracker: &ImageTracker,
    images: &[Image],
    containers: &[Container],
    sandboxes: &SandboxImages,
    now: SystemTime,
) -> Vec<String> {
    tracker
        .unused(images, containers, sandboxes, now)
        .iter()
        .map(|i| i.id.clone())
        .collect()
}

#[test]
fn unused_images_go_least_recently_used_first_and_never_one_a_container_runs() {
    let images = [
        image("sha256:a", "registry/a:1"),
        image("sha256:b", "registry/b:1"),
        image("sha256:c", "registry/c:1"),
        Image {
            pinned: true,
            ..image("sha256:pinned", "registry/pinned:1")
        },
    ];
    let mut tracker = ImageTracker::new(Duration::ZERO);
    // t0: a and b in use (b by an exited container, which still counts).
    let first = [
        container("1", "s", "x", false, 0, "sha256:a"),
        container("2", "s", "y", true, 0, "registry/b:1"),
    ];
    tracker.observe(&images, &first, at(0));
    // t+10: only a in use. t+20: nothing.
    tracker.observe(&images, &first[..1], at(10));
    tracker.observe(&images, &[], at(20));
    let none = SandboxImages::default();
    // c was never used (kubelet's zero time, first); b last used at t0,
    // a at t+10; the pinned one never.
    assert_eq!(
        unused_ids(&tracker, &images, &[], &none, at(20)),
        ["sha256:c", "sha256:b", "sha256:a"]
    );
    // A container on an image keeps it.
    let running = [container("3", "s", "z", false, 0, "sha256:a")];
    tracker.observe(&images, &running, at(30));
    assert_eq!(
        unused_ids(&tracker, &images, &running, &none, at(30)),
        ["sha256:c", "sha256:b"]
    );
}

#[test]
fn an_image_never_observed_is_not_removed() {
    let images = [image("sha256:new", "registry/new:1")];
    let tracker = ImageTracker::new(Duration::ZERO);
    assert!(
        tracker
            .unused(&images, &[], &SandboxImages::default(), at(0))
            .is_empty()
    );
}

/// kubelet's `imageMinimumGCAge`: an image first seen less than the
/// minimum age ago (just pulled for a container not yet created) stays.
#[test]
fn an_image_younger_than_the_minimum_age_stays() {
    let images = [
        image("sha256:old", "registry/old:1"),
        image("sha256:new", "registry/new:1"),
    ];
    let mut tracker = ImageTracker::new(images::DEFAULT_MINIMUM_AGE);
    tracker.observe(&images[..1], &[], at(0));
    tracker.observe(&images, &[], at(100));
    let none = SandboxImages::default();
    assert_eq!(
        unused_ids(&tracker, &images, &[], &none, at(110)),
        Vec::<String>::new(),
        "old is 110 s old, new 10 s: both under 2m"
    );
    assert_eq!(
        unused_ids(&tracker, &images, &[], &none, at(120)),
        ["sha256:old"]
    );
    assert_eq!(
        unused_ids(&tracker, &images, &[], &none, at(220)),
        ["sha256:old", "sha256:new"]
    );
}

/// What a runtime's sandboxes run is never removed, whether or not the
/// runtime names its sandbox image in its configuration, and nothing is
/// removed while a sandbox's image is unknown.
#[test]
fn no_image_a_sandbox_runs_is_removed() {
    let images = [
        image("sha256:pause", "registry/pause:3"),
        image("sha256:old-pause", "registry/pause:2"),
        image("sha256:spare", "registry/spare:1"),
    ];
    let mut tracker = ImageTracker::new(Duration::ZERO);
    tracker.observe(&images, &[], at(0));
    // No configuration, one sandbox on each pause image.
    let sandboxes = sandboxes_run(&["registry/pause:3", "sha256:old-pause"]);
    assert_eq!(
        unused_ids(&tracker, &images, &[], &sandboxes, at(1)),
        ["sha256:spare"]
    );
    let configured = SandboxImages {
        configured: Some("registry/pause:3".into()),
        ..SandboxImages::default()
    };
    assert_eq!(
        unused_ids(&tracker, &images, &[], &configured, at(1)),
        ["sha256:old-pause", "sha256:spare"]
    );
    let unknown = SandboxImages {
        unnamed: 1,
        ..sandboxes_run(&["registry/pause:3"])
    };
    assert!(unused_ids(&tracker, &images, &[], &unknown, at(1)).is_empty());
}

/// First sightings outlive the agent: a restart takes neither an old image
/// for a new one nor, worse, a new one for an old one.
#[test]
fn first_sightings_are_kept_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let images = [
        image("sha256:old", "registry/old:1"),
        image("sha256:gone", "registry/gone:1"),
    ];
    let minimum = images::DEFAULT_MINIMUM_AGE;
    let mut first = ImageTracker::persisted(minimum, state.clone());
    first.observe(&images, &[], at(0));
    first.observe(&images[..1], &[], at(50));
    drop(first);

    // Restarted at t+130: old was seen at t0, so it may go; an image
    // pulled while the agent was away is new.
    let mut restarted = ImageTracker::persisted(minimum, state.clone());
    let now = [
        image("sha256:old", "registry/old:1"),
        image("sha256:pulled", "registry/pulled:1"),
    ];
    restarted.observe(&now, &[], at(130));
    let none = SandboxImages::default();
    assert_eq!(
        unused_ids(&restarted, &now, &[], &none, at(130)),
        ["sha256:old"]
    );
    // Without the file every image is new again.
    let forgetful = {
        let mut tracker = ImageTracker::new(minimum);
        tracker.observe(&now, &[], at(130));
        tracker
    };
    assert!(unused_ids(&forgetful, &now, &[], &none, at(130)).is_empty());

    // A file that cannot be read is set aside; the agent starts anyway.
    std::fs::write(dir.path().join("images-first-seen.json"), b"{not json").unwrap();
    let mut fresh = ImageTracker::persisted(minimum, state);
    fresh.observe(&now, &[], at(200));
    assert!(unused_ids(&fresh, &now, &[], &none, at(200)).is_empty());
    assert!(dir.path().join("images-first-seen.json.corrupt").exists());
}

/// A first sighting no clock can hold, in a corrupt or forged file (adding
/// it to the epoch panicked, and the agent with it at every start), is an
/// image seen now.
#[test]
fn a_first_sighting_past_what_the_clock_holds_is_an_image_seen_now() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    std::fs::write(
        dir.path().join("images-first-seen.json"),
        format!(
            r#"{{"format": 1, "first_seen": {{"sha256:far": {}, "sha256:old": {}}}}}"#,
            u64::MAX,
            at(0)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        ),
    )
    .unwrap();
    let mut tracker = ImageTracker::persisted(images::DEFAULT_MINIMUM_AGE, state);
    let now = [
        image("sha256:far", "registry/far:1"),
        image("sha256:old", "registry/old:1"),
    ];
    tracker.observe(&now, &[], at(130));
    let none = SandboxImages::default();
    assert_eq!(
        unused_ids(&tracker, &now, &[], &none, at(130)),
        ["sha256:old"]
    );
}
