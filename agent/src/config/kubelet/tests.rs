use super::*;

fn args(flags: &[(&str, &str)]) -> EvictionArgs {
    let mut args = EvictionArgs::default();
    for (flag, value) in flags {
        let value = (*value).to_owned();
        match *flag {
            "hard" => args.eviction_hard.push(value),
            "soft" => args.eviction_soft.push(value),
            "grace" => args.eviction_soft_grace_period.push(value),
            "reclaim" => args.eviction_minimum_reclaim.push(value),
            "max-grace" => args.eviction_max_pod_grace_period = Some(value),
            "transition" => args.eviction_pressure_transition_period = Some(value),
            other => panic!("no flag {other}"),
        }
    }
    args
}

fn resolve(flags: &[(&str, &str)]) -> EvictionConfig {
    args(flags).resolve().unwrap()
}

fn error(flags: &[(&str, &str)]) -> String {
    args(flags).resolve().unwrap_err().to_string()
}

fn signals(config: &EvictionConfig) -> Vec<(Signal, ThresholdValue, bool)> {
    config
        .thresholds
        .iter()
        .map(|t| (t.signal, t.value, t.hard))
        .collect()
}

fn config_file(text: &str) -> (tempfile::TempDir, EvictionArgs) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.yaml");
    fs::write(&path, text).unwrap();
    let args = EvictionArgs {
        config: Some(path),
        ..EvictionArgs::default()
    };
    (dir, args)
}

#[test]
fn defaults_are_kubelets_linux_defaults_with_the_allocatable_copy() {
    let config = resolve(&[]);
    assert_eq!(
        signals(&config),
        [
            (
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(104857600),
                true
            ),
            (
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(104857600),
                true
            ),
            (
                Signal::NodeFsAvailable,
                ThresholdValue::Percentage(0.1),
                true
            ),
            (
                Signal::NodeFsInodesFree,
                ThresholdValue::Percentage(0.05),
                true
            ),
            (
                Signal::ImageFsAvailable,
                ThresholdValue::Percentage(0.15),
                true
            ),
            (
                Signal::ImageFsInodesFree,
                ThresholdValue::Percentage(0.05),
                true
            ),
        ]
    );
    assert_eq!(config.pressure_transition_period, Duration::from_secs(300));
    assert_eq!(config.max_pod_grace_period, Duration::ZERO);
}

#[test]
fn a_hard_flag_replaces_the_defaults_and_an_empty_one_clears_them() {
    let config = resolve(&[
        ("hard", "memory.available<1Gi"),
        ("hard", "pid.available<10%"),
    ]);
    assert_eq!(
        signals(&config),
        [
            (
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(1 << 30),
                true
            ),
            (
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(1 << 30),
                true
            ),
            (Signal::PidAvailable, ThresholdValue::Percentage(0.1), true),
        ]
    );
    assert!(resolve(&[("hard", "")]).thresholds.is_empty());
}

#[test]
fn zero_and_hundred_percent_disable_and_a_zero_quantity_is_an_error() {
    let config = resolve(&[(
        "hard",
        "memory.available<0%,nodefs.available<100%,pid.available<1",
    )]);
    assert_eq!(
        signals(&config),
        [(Signal::PidAvailable, ThresholdValue::Quantity(1), true)]
    );
    // kubelet's parseThresholdStatement: "must be positive".
    for flags in [
        vec![("hard", "memory.available<0")],
        vec![("hard", "memory.available<0Mi")],
        vec![("hard", "pid.available<0.0")],
        vec![
            ("soft", "memory.available<0Gi"),
            ("grace", "memory.available=1m"),
        ],
    ] {
        let message = error(&flags);
        let (_, value) = flags[0].1.split_once('<').unwrap();
        assert!(
            message.contains(&format!("{value:?}")) && message.contains("positive"),
            "{flags:?}: {message}"
        );
    }
    let (_dir, file) = config_file("evictionHard:\n  memory.available: \"0\"\n");
    let message = file.resolve().unwrap_err().to_string();
    assert!(
        message.contains("\"0\"") && message.contains("kubelet.yaml"),
        "{message}"
    );
    // A minimum reclaim of zero is no minimum, as in kubelet.
    let config = resolve(&[
        ("hard", "memory.available<1Gi"),
        ("reclaim", "memory.available=0"),
    ]);
    assert_eq!(
        config.thresholds[0].min_reclaim,
        ThresholdValue::Quantity(0)
    );
}

#[test]
fn a_signal_given_twice_keeps_the_last_value_with_a_warning() {
    let (config, warnings) = args(&[
        ("hard", "memory.available<1Gi,nodefs.available<5%"),
        ("hard", "memory.available<2Gi"),
        ("grace", "memory.available=1m,memory.available=2m"),
    ])
    .resolve_with_warnings()
    .unwrap();
    let memory = config
        .thresholds
        .iter()
        .find(|t| t.signal == Signal::MemoryAvailable)
        .unwrap();
    assert_eq!(memory.value, ThresholdValue::Quantity(2 << 30));
    assert_eq!(
        warnings,
        [
            ConfigWarning::Duplicate {
                origin: "--eviction-hard".into(),
                signal: "memory.available".into(),
                replaced: "1Gi".into(),
                kept: "2Gi".into(),
            },
            ConfigWarning::Duplicate {
                origin: "--eviction-soft-grace-period".into(),
                signal: "memory.available".into(),
                replaced: "1m".into(),
                kept: "2m".into(),
            },
        ]
    );
    let message = warnings[0].to_string();
    assert!(
        message.contains("\"2Gi\"") && message.contains("\"1Gi\""),
        "{message}"
    );
    // The value replaced is never parsed, as kubelet never sees it.
    let config = resolve(&[("hard", "memory.available<lots,memory.available<1Gi")]);
    assert_eq!(
        config.thresholds[0].value,
        ThresholdValue::Quantity(1 << 30)
    );

    let (_dir, file) =
        config_file("evictionHard:\n  memory.available: 1Gi\n  memory.available: 2Gi\n");
    let (config, warnings) = file.resolve_with_warnings().unwrap();
    assert_eq!(
        config.thresholds[0].value,
        ThresholdValue::Quantity(2 << 30)
    );
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].to_string().contains("kubelet.yaml"),
        "{}",
        warnings[0]
    );
}

#[test]
fn a_zero_transition_period_in_the_file_is_kubelets_default_but_not_on_the_command_line() {
    for zero in ["0s", "0", "0m0s"] {
        let (_dir, file) = config_file(&format!("evictionPressureTransitionPeriod: {zero}\n"));
        let config = file.resolve().unwrap();
        assert_eq!(
            config.pressure_transition_period,
            Duration::from_secs(300),
            "{zero}"
        );
        let flag = EvictionArgs {
            eviction_pressure_transition_period: Some(zero.to_owned()),
            ..file
        };
        assert_eq!(
            flag.resolve().unwrap().pressure_transition_period,
            Duration::ZERO,
            "{zero}"
        );
    }
}

#[test]
fn soft_thresholds_take_their_grace_and_min_reclaim_applies_to_both_kinds() {
    let config = resolve(&[
        ("hard", "memory.available<100Mi"),
        ("soft", "memory.available<300Mi"),
        ("grace", "memory.available=1m30s"),
        ("reclaim", "memory.available=50Mi"),
        ("max-grace", "60"),
        ("transition", "30s"),
    ]);
    let soft = config.thresholds.iter().find(|t| !t.hard).unwrap();
    assert_eq!(soft.grace_period, Duration::from_secs(90));
    assert_eq!(soft.min_reclaim, ThresholdValue::Quantity(50 << 20));
    let allocatable = config
        .thresholds
        .iter()
        .find(|t| t.signal == Signal::AllocatableMemoryAvailable)
        .unwrap();
    assert_eq!(allocatable.min_reclaim, ThresholdValue::Quantity(50 << 20));
    assert!(allocatable.hard, "only hard thresholds are copied");
    assert_eq!(config.thresholds.len(), 3);
    assert_eq!(config.max_pod_grace_period, Duration::from_secs(60));
    assert_eq!(config.pressure_transition_period, Duration::from_secs(30));
}

#[test]
fn every_invalid_input_is_an_error_quoting_the_text() {
    for (flags, quoted) in [
        (vec![("hard", "memory.free<1Gi")], "memory.free"),
        (vec![("hard", "memory.available")], "memory.available"),
        (vec![("hard", "memory.available<-1Mi")], "-1Mi"),
        (vec![("hard", "memory.available<12Xi")], "12Xi"),
        (vec![("hard", "memory.available<0")], "\"0\""),
        (vec![("hard", "nodefs.available<101%")], "101%"),
        (vec![("hard", "nodefs.available<-5%")], "-5%"),
        (vec![("hard", "nodefs.available<lots%")], "lots%"),
        (
            vec![("soft", "memory.available<1Gi")],
            "memory.available<1Gi",
        ),
        (
            vec![
                ("soft", "memory.available<1Gi"),
                ("grace", "memory.available=-1s"),
            ],
            "-1s",
        ),
        (
            vec![
                ("soft", "memory.available<1Gi"),
                ("grace", "memory.available=soon"),
            ],
            "soon",
        ),
        (vec![("grace", "memory.free=1s")], "memory.free"),
        (vec![("reclaim", "memory.available=-1Mi")], "-1Mi"),
        (vec![("reclaim", "memory.free=1Mi")], "memory.free"),
        (vec![("max-grace", "-1")], "-1"),
        (vec![("max-grace", "ten")], "ten"),
        (vec![("transition", "5 minutes")], "5 minutes"),
    ] {
        let message = error(&flags);
        assert!(message.contains(quoted), "{flags:?}: {message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
}

#[test]
fn percentages_resolve_with_kubelets_float32_arithmetic() {
    let config = resolve(&[("hard", "nodefs.available<10%")]);
    let value = config.thresholds[0].value;
    // float32(0.1) is a little above 0.1: kubelet's threshold is 16 bytes
    // above the exact tenth of 10 GiB.
    assert_eq!(value.resolve(10 << 30), 1073741840);
    assert_eq!(ThresholdValue::Quantity(5).resolve(10 << 30), 5);
}

#[test]
fn the_config_file_is_read_in_yaml_or_json_and_flags_override_it() {
    let (_dir, yaml) = config_file(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         cgroupDriver: systemd\n\
         evictionHard:\n  memory.available: 200Mi\n  pid.available: 100\n\
         evictionSoft:\n  memory.available: 500Mi\n\
         evictionSoftGracePeriod:\n  memory.available: 2m\n\
         evictionMaxPodGracePeriod: 45\n\
         evictionPressureTransitionPeriod: 1m\n\
         enforceNodeAllocatable: [\"pods\", \"system-reserved\"]\n",
    );
    let config = yaml.resolve().unwrap();
    assert_eq!(
        signals(&config),
        [
            (
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(200 << 20),
                true
            ),
            (
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(200 << 20),
                true
            ),
            (Signal::PidAvailable, ThresholdValue::Quantity(100), true),
            (
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(500 << 20),
                false
            ),
        ]
    );
    assert_eq!(config.max_pod_grace_period, Duration::from_secs(45));
    assert_eq!(config.pressure_transition_period, Duration::from_secs(60));

    let overridden = EvictionArgs {
        eviction_hard: vec!["memory.available<1Gi".into()],
        eviction_pressure_transition_period: Some("10s".into()),
        ..yaml
    };
    let config = overridden.resolve().unwrap();
    assert_eq!(
        config.thresholds[0].value,
        ThresholdValue::Quantity(1 << 30)
    );
    assert_eq!(config.pressure_transition_period, Duration::from_secs(10));
    assert_eq!(
        config.max_pod_grace_period,
        Duration::from_secs(45),
        "kept from the file"
    );

    let (_dir, json) = config_file(
        r#"{"evictionHard": {"nodefs.available": "20%"}, "enforceNodeAllocatable": []}"#,
    );
    assert_eq!(
        signals(&json.resolve().unwrap()),
        [(
            Signal::NodeFsAvailable,
            ThresholdValue::Percentage(0.2),
            true
        )]
    );
}

#[test]
fn merging_defaults_fills_the_signals_the_file_leaves_out() {
    let (_dir, args) = config_file(
        "evictionHard:\n  memory.available: 1Gi\nmergeDefaultEvictionSettings: true\n\
         enforceNodeAllocatable: []\n",
    );
    let config = args.resolve().unwrap();
    let got: Vec<_> = config
        .thresholds
        .iter()
        .map(|t| (t.signal, t.value))
        .collect();
    assert_eq!(
        got,
        [
            (Signal::MemoryAvailable, ThresholdValue::Quantity(1 << 30)),
            (Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1)),
            (Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
            (Signal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
            (Signal::ImageFsInodesFree, ThresholdValue::Percentage(0.05)),
        ]
    );
    let (_dir, cleared) = config_file("evictionHard: {}\n");
    assert!(cleared.resolve().unwrap().thresholds.is_empty());
}

#[test]
fn a_bad_config_file_is_an_error_naming_it() {
    let (_dir, args) = config_file("evictionHard: [not, a, map]\n");
    let message = args.resolve().unwrap_err().to_string();
    assert!(message.contains("kubelet.yaml"), "{message}");
    let (_dir, args) = config_file("evictionHard:\n  memory.free: 1Gi\n");
    let message = args.resolve().unwrap_err().to_string();
    assert!(
        message.contains("memory.free") && message.contains("evictionHard in"),
        "{message}"
    );
    let missing = EvictionArgs {
        config: Some("/nonexistent/kubelet.yaml".into()),
        ..EvictionArgs::default()
    };
    let message = missing.resolve().unwrap_err().to_string();
    assert!(message.contains("/nonexistent/kubelet.yaml"), "{message}");
}

#[test]
fn thresholds_print_in_the_contracts_shape() {
    let config = resolve(&[("hard", "memory.available<150Mi,nodefs.available<10%")]);
    // As printed: an f32 prints as its shortest decimal, 0.1.
    let text = serde_json::to_string(&config.thresholds).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json[0],
        serde_json::json!({"signal": "memory.available", "operator": "LessThan",
            "value": {"quantity": 157286400}, "grace_period_seconds": 0,
            "min_reclaim": {"quantity": 0}})
    );
    assert_eq!(json[2]["value"], serde_json::json!({"percentage": 0.1}));
}

#[test]
fn minimum_reclaim_follows_kubelets_rules() {
    let reclaim_of = |text: &str| {
        resolve(&[("hard", "memory.available<1Gi"), ("reclaim", text)]).thresholds[0].min_reclaim
    };
    assert_eq!(
        reclaim_of("memory.available=0"),
        ThresholdValue::Quantity(0)
    );
    assert_eq!(
        reclaim_of("memory.available=10%"),
        ThresholdValue::Percentage(0.1)
    );
    // Unlike a threshold, a 100% minimum reclaim is a value, not "disabled".
    assert_eq!(
        reclaim_of("memory.available=100%"),
        ThresholdValue::Percentage(1.0)
    );
    for text in [
        "memory.available=0%",
        "memory.available=-5%",
        "memory.available=150%",
        "memory.available=some%",
    ] {
        let message = error(&[("reclaim", text)]);
        let quoted = text.trim_start_matches("memory.available=");
        assert!(message.contains(&format!("{quoted:?}")), "{message}");
    }
}

#[test]
fn percentages_are_parsed_as_kubelet_parses_them() {
    for (text, fraction) in [("33.3%", 33.3f32 / 100.0), ("5%", 0.05), ("0.5%", 0.005)] {
        let config = resolve(&[("hard", &format!("nodefs.available<{text}"))]);
        assert_eq!(
            config.thresholds[0].value,
            ThresholdValue::Percentage(fraction),
            "{text}"
        );
    }
    // Any spelling of 0% or 100% disables the threshold.
    assert!(
        resolve(&[("hard", "nodefs.available<0.0%,imagefs.available<100.0%")])
            .thresholds
            .is_empty()
    );
    for text in ["nan%", "inf%", "%", "1e39%"] {
        let message = error(&[("hard", &format!("nodefs.available<{text}"))]);
        assert!(message.contains(&format!("{text:?}")), "{message}");
    }
}

#[test]
fn max_pod_grace_period_is_kubelets_int32() {
    assert_eq!(
        resolve(&[("max-grace", "2147483647")]).max_pod_grace_period,
        Duration::from_secs(2147483647)
    );
    let message = error(&[("max-grace", "2147483648")]);
    assert!(message.contains("\"2147483648\""), "{message}");
}

#[test]
fn an_explicit_allocatable_threshold_does_not_stop_kubelets_copy() {
    let config = resolve(&[
        (
            "hard",
            "memory.available<100Mi,allocatableMemory.available<500Mi",
        ),
        (
            "reclaim",
            "memory.available=1Gi,allocatableMemory.available=10Mi",
        ),
    ]);
    let got: Vec<_> = config
        .thresholds
        .iter()
        .map(|t| (t.signal, t.value, t.min_reclaim))
        .collect();
    assert_eq!(
        got,
        [
            (
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(100 << 20),
                ThresholdValue::Quantity(1 << 30)
            ),
            (
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(500 << 20),
                ThresholdValue::Quantity(10 << 20)
            ),
            // The copy keeps memory.available's minimum reclaim.
            (
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(100 << 20),
                ThresholdValue::Quantity(1 << 30)
            ),
        ]
    );
}

#[test]
fn enforce_node_allocatable_without_pods_adds_no_copy() {
    let (_dir, args) = config_file(
        "evictionHard:\n  memory.available: 1Gi\nenforceNodeAllocatable: [system-reserved]\n",
    );
    assert_eq!(
        signals(&args.resolve().unwrap()),
        [(
            Signal::MemoryAvailable,
            ThresholdValue::Quantity(1 << 30),
            true
        )]
    );
}

#[test]
fn each_field_of_the_file_yields_to_its_own_flag_only() {
    let (_dir, file) = config_file(
        r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "evictionHard": {"memory.available": "1Gi"},
            "evictionSoft": {"memory.available": "2Gi", "nodefs.available": "20%"},
            "evictionSoftGracePeriod": {"memory.available": "1m", "nodefs.available": "2m"},
            "evictionMinimumReclaim": {"memory.available": "100Mi"},
            "mergeDefaultEvictionSettings": false, "enforceNodeAllocatable": []}"#,
    );
    let args = EvictionArgs {
        eviction_soft_grace_period: vec!["memory.available=30s,nodefs.available=10s".into()],
        eviction_minimum_reclaim: vec!["memory.available=5%".into()],
        ..file
    };
    let config = args.resolve().unwrap();
    let got: Vec<_> = config
        .thresholds
        .iter()
        .map(|t| (t.signal, t.hard, t.grace_period.as_secs(), t.min_reclaim))
        .collect();
    assert_eq!(
        got,
        [
            (
                Signal::MemoryAvailable,
                true,
                0,
                ThresholdValue::Percentage(0.05)
            ),
            (
                Signal::MemoryAvailable,
                false,
                30,
                ThresholdValue::Percentage(0.05)
            ),
            (
                Signal::NodeFsAvailable,
                false,
                10,
                ThresholdValue::Quantity(0)
            ),
        ]
    );
}

#[test]
fn errors_in_the_file_quote_the_text_and_name_the_file() {
    for (text, quoted) in [
        ("evictionHard:\n  memory.available: -1Gi\n", "-1Gi"),
        (
            "evictionSoft:\n  memory.available: 1Gi\n",
            "memory.available<1Gi",
        ),
        (
            "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: -1m\n",
            "-1m",
        ),
        (
            "evictionSoftGracePeriod:\n  memory.free: 1m\n",
            "memory.free",
        ),
        ("evictionMinimumReclaim:\n  pid.available: lots\n", "lots"),
        ("evictionMaxPodGracePeriod: -1\n", "-1"),
        ("evictionPressureTransitionPeriod: 5\n", "5"),
        ("{not yaml", "kubelet.yaml"),
    ] {
        let (_dir, args) = config_file(text);
        let message = args.resolve().unwrap_err().to_string();
        assert!(message.contains(quoted), "{text}: {message}");
        assert!(message.contains("kubelet.yaml"), "{text}: {message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
}

#[test]
fn a_soft_threshold_without_grace_is_hard_as_in_kubelet() {
    let config = resolve(&[
        ("hard", ""),
        ("soft", "memory.available<1Gi"),
        ("grace", "memory.available=0s"),
    ]);
    // The copy joins the hard thresholds, listed before the soft ones.
    assert_eq!(
        signals(&config),
        [
            (
                Signal::AllocatableMemoryAvailable,
                ThresholdValue::Quantity(1 << 30),
                true
            ),
            (
                Signal::MemoryAvailable,
                ThresholdValue::Quantity(1 << 30),
                true
            ),
        ]
    );
}

/// kubelet's `imageMinimumGCAge`, read where kubelet reads it; a zero one
/// is kubelet's defaulting's to replace.
#[test]
fn the_image_minimum_age_comes_from_the_kubelet_config() {
    let (_dir, args) = config_file("imageMinimumGCAge: 5m30s\n");
    assert_eq!(
        args.config_image_minimum_gc_age().unwrap(),
        Some(Duration::from_secs(330))
    );
    let (_dir, args) = config_file("imageMinimumGCAge: 0s\n");
    assert_eq!(args.config_image_minimum_gc_age().unwrap(), None);
    let (_dir, args) = config_file("evictionHard: {}\n");
    assert_eq!(args.config_image_minimum_gc_age().unwrap(), None);
    let (_dir, args) = config_file("imageMinimumGCAge: soon\n");
    let error = args.config_image_minimum_gc_age().unwrap_err();
    assert!(
        error.to_string().contains("imageMinimumGCAge in"),
        "{error}"
    );
    assert!(error.to_string().contains("\"soon\""), "{error}");
}
