//! The watched scopes as pure state: a reading goes in, what changed comes
//! out (a crossing to report, the band the kernel should hold). Reading
//! cgroupfs, writing BPF maps, logging and metrics are the monitor's.
use std::collections::BTreeMap;

use evictd_common::Band;

use crate::{kernel::bpf::ScopeKind, scopes::levels::Levels};

/// A scope as the kernel names it: the cgroup id in its scope map, or
/// [`evictd_common::NODE_PIDS_SCOPE_ID`] for every task on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ScopeKey {
    pub kind: ScopeKind,
    pub id: u64,
}

/// Who asked for a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A `--watch-*` flag: crossings are reported, nothing more.
    Flag,
    /// The eviction engine: the lines at which one of its thresholds could
    /// be met. A crossing wakes the engine.
    Engine,
}

/// A fresh reading of a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Bytes charged, or tasks: what the thresholds compare.
    pub value: u64,
    /// kubelet's working set, for memory scopes.
    pub working_set: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scope {
    /// Cgroup path relative to the hierarchy root; `None` for node tasks.
    pub path: Option<String>,
    pub levels: Levels,
    /// Thresholds crossed, as of the last reading.
    pub level: usize,
    /// Whether a kernel band watches this scope (else it is polled).
    pub kernel: bool,
    pub owner: Owner,
}

impl Scope {
    /// The `scope` label of logs and metrics.
    pub(crate) fn label(&self) -> &str {
        self.path.as_deref().unwrap_or("node")
    }
}

/// A move of a scope from one level to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LevelChange {
    pub from: usize,
    pub to: usize,
    /// The threshold crossed: the highest reached when rising, the lowest
    /// left when falling.
    pub threshold: u64,
}

impl LevelChange {
    pub(crate) fn direction(&self) -> &'static str {
        if self.to > self.from {
            "above"
        } else {
            "below"
        }
    }
}

/// What one reading changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settled {
    pub change: Option<LevelChange>,
    /// The band the kernel should hold now; `None` for a polled scope.
    pub band: Option<Band>,
}

/// Every watched scope, by key.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    scopes: BTreeMap<ScopeKey, Scope>,
}

impl Registry {
    /// Starts watching `key` at the level `reading` puts it at (a crossing
    /// from level 0 if that is above 0). Replaces a scope of the same key;
    /// returns the replaced one's owner if it differs.
    pub(crate) fn install(
        &mut self,
        key: ScopeKey,
        path: Option<String>,
        levels: Levels,
        kernel: bool,
        owner: Owner,
        reading: Reading,
    ) -> (Settled, Option<Owner>) {
        let replaced = self
            .scopes
            .get(&key)
            .map(|scope| scope.owner)
            .filter(|previous| *previous != owner);
        self.scopes.insert(
            key,
            Scope {
                path,
                levels,
                level: 0,
                kernel,
                owner,
            },
        );
        (self.settle(key, reading).unwrap_or(UNCHANGED), replaced)
    }

    /// Moves `key` to the level `reading` puts it at. `None` for a scope
    /// not watched.
    pub(crate) fn settle(&mut self, key: ScopeKey, reading: Reading) -> Option<Settled> {
        let scope = self.scopes.get_mut(&key)?;
        let next = scope.levels.next_level(scope.level, reading.value);
        let change = (next != scope.level).then(|| LevelChange {
            from: scope.level,
            to: next,
            threshold: scope.levels.crossed(scope.level, next),
        });
        scope.level = next;
        Some(Settled {
            change,
            band: scope.kernel.then(|| scope.levels.band(next, reading.value)),
        })
    }

    /// New thresholds for `key`, then [`Registry::settle`].
    pub(crate) fn set_levels(
        &mut self,
        key: ScopeKey,
        levels: Levels,
        reading: Reading,
    ) -> Option<Settled> {
        self.scopes.get_mut(&key)?.levels = levels;
        self.settle(key, reading)
    }

    /// From now on `key` is polled rather than watched by a kernel band
    /// (the band could not be armed: a full scope map, say).
    pub(crate) fn poll_instead(&mut self, key: ScopeKey) {
        if let Some(scope) = self.scopes.get_mut(&key) {
            scope.kernel = false;
        }
    }

    pub(crate) fn remove(&mut self, key: ScopeKey) -> Option<Scope> {
        self.scopes.remove(&key)
    }

    pub(crate) fn get(&self, key: ScopeKey) -> Option<&Scope> {
        self.scopes.get(&key)
    }

    /// The scope of `kind` at `path` that `owner` installed.
    pub(crate) fn find(
        &self,
        kind: ScopeKind,
        path: Option<&str>,
        owner: Owner,
    ) -> Option<ScopeKey> {
        self.scopes
            .iter()
            .find(|(key, scope)| {
                key.kind == kind && scope.owner == owner && scope.path.as_deref() == path
            })
            .map(|(key, _)| *key)
    }

    /// Whether any scope of `kind` watches `path`.
    pub(crate) fn watches(&self, kind: ScopeKind, path: &str) -> bool {
        self.scopes
            .iter()
            .any(|(key, scope)| key.kind == kind && scope.path.as_deref() == Some(path))
    }

    /// Whether the kernel watches any scope of `kind`.
    pub(crate) fn kernel_watches_any(&self, kind: ScopeKind) -> bool {
        self.scopes
            .iter()
            .any(|(key, scope)| key.kind == kind && scope.kernel)
    }

    /// Whether the kernel watches any scope of `kind` that `owner` installed.
    pub(crate) fn kernel_watches_any_of(&self, kind: ScopeKind, owner: Owner) -> bool {
        self.scopes
            .iter()
            .any(|(key, scope)| key.kind == kind && scope.kernel && scope.owner == owner)
    }

    /// Keys of the scopes `owner` installed.
    pub(crate) fn keys_of(&self, owner: Owner) -> Vec<ScopeKey> {
        self.scopes
            .iter()
            .filter(|(_, scope)| scope.owner == owner)
            .map(|(key, _)| *key)
            .collect()
    }

    /// Whether an engine scope is past one of its thresholds: usage where a
    /// threshold could be met, which only a fresh read of the working set
    /// can tell.
    pub(crate) fn engine_raised(&self) -> bool {
        self.scopes
            .values()
            .any(|scope| scope.owner == Owner::Engine && scope.level > 0)
    }
}

const UNCHANGED: Settled = Settled {
    change: None,
    band: None,
};

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: ScopeKey = ScopeKey {
        kind: ScopeKind::Memory,
        id: 7,
    };

    fn reading(value: u64) -> Reading {
        Reading {
            value,
            working_set: None,
        }
    }

    fn install(registry: &mut Registry, kernel: bool, value: u64) -> Settled {
        registry
            .install(
                KEY,
                Some("/a".into()),
                Levels::new(vec![100, 200], 10),
                kernel,
                Owner::Flag,
                reading(value),
            )
            .0
    }

    #[test]
    fn an_install_above_a_threshold_is_a_crossing_from_level_zero() {
        let mut registry = Registry::default();
        let settled = install(&mut registry, true, 150);
        assert_eq!(
            settled.change,
            Some(LevelChange {
                from: 0,
                to: 1,
                threshold: 100
            })
        );
        let band = settled.band.unwrap();
        assert_eq!((band.fall_below, band.rise_at), (90, 200));
    }

    #[test]
    fn a_reading_inside_the_band_changes_nothing_but_rearms() {
        let mut registry = Registry::default();
        install(&mut registry, true, 150);
        let settled = registry.settle(KEY, reading(95)).unwrap();
        assert_eq!(settled.change, None, "inside the hysteresis");
        assert!(settled.band.is_some(), "the kernel is re-armed around it");
        let settled = registry.settle(KEY, reading(50)).unwrap();
        assert_eq!(settled.change.unwrap().direction(), "below");
    }

    #[test]
    fn a_polled_scope_has_no_band() {
        let mut registry = Registry::default();
        assert_eq!(install(&mut registry, false, 0).band, None);
    }

    #[test]
    fn the_engine_is_raised_while_one_of_its_scopes_is() {
        let mut registry = Registry::default();
        let (_, replaced) = registry.install(
            KEY,
            Some("/node".into()),
            Levels::new(vec![100], 10),
            true,
            Owner::Engine,
            reading(120),
        );
        assert_eq!(replaced, None);
        assert!(registry.engine_raised());
        assert_eq!(
            registry.find(ScopeKind::Memory, Some("/node"), Owner::Engine),
            Some(KEY)
        );
        let settled = registry
            .set_levels(KEY, Levels::new(vec![200], 10), reading(120))
            .unwrap();
        assert_eq!(settled.change.unwrap().to, 0);
        assert!(!registry.engine_raised());
        let (_, replaced) = registry.install(
            KEY,
            Some("/node".into()),
            Levels::new(vec![100], 10),
            true,
            Owner::Flag,
            reading(0),
        );
        assert_eq!(
            replaced,
            Some(Owner::Engine),
            "a flag now names the engine's scope"
        );
        assert!(registry.keys_of(Owner::Engine).is_empty());
    }
}
