use std::time::Duration;

use super::*;
use crate::node::runtime::fixtures::{self, on_image};

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
    let dead: Vec<&str> = dead_containers(&sandboxes, &containers)
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    // app-2 and job-1 stay for `logs --previous`; the gone pod loses all.
    assert_eq!(dead, ["old-1", "app-1", "old-2"]);
}

#[test]
fn unused_images_go_least_recently_used_first_and_never_the_sandbox_image() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let later = |s| t0 + Duration::from_secs(s);
    let images = [
        image("sha256:a", "registry/a:1"),
        image("sha256:b", "registry/b:1"),
        image("sha256:c", "registry/c:1"),
        image("sha256:pause", "registry/pause:3"),
        Image {
            pinned: true,
            ..image("sha256:pinned", "registry/pinned:1")
        },
    ];
    let mut tracker = ImageTracker::default();
    // t0: a and b in use (b by an exited container, which still counts).
    let first = [
        container("1", "s", "x", false, 0, "sha256:a"),
        container("2", "s", "y", true, 0, "registry/b:1"),
    ];
    tracker.observe(&images, &first, t0);
    // t+10: only a in use. t+20: nothing; c was last "used" when first seen.
    tracker.observe(&images, &first[..1], later(10));
    tracker.observe(&images, &[], later(20));
    let unused: Vec<&str> = tracker
        .unused(&images, &[], Some("registry/pause:3"))
        .iter()
        .map(|i| i.id.as_str())
        .collect();
    // c: last used t0 (first detected t0); b: t0 too, same order by id;
    // a: t+10. pause (sandbox image) and the pinned one never.
    assert_eq!(unused, ["sha256:b", "sha256:c", "sha256:a"]);
    // A container on an image keeps it.
    let running = [container("3", "s", "z", false, 0, "sha256:a")];
    tracker.observe(&images, &running, later(30));
    let unused: Vec<&str> = tracker
        .unused(&images, &running, None)
        .iter()
        .map(|i| i.id.as_str())
        .collect();
    assert_eq!(unused, ["sha256:b", "sha256:c", "sha256:pause"]);
}

#[test]
fn an_image_never_observed_is_not_removed() {
    let images = [image("sha256:new", "registry/new:1")];
    let tracker = ImageTracker::default();
    assert!(tracker.unused(&images, &[], None).is_empty());
}
