//! README's command-line tables and `evictd run`: every flag has its row,
//! and every row names a flag the agent takes.
use std::collections::BTreeSet;

use clap::CommandFactory as _;
use evictd::config::Cli;

#[test]
fn readme_documents_exactly_the_flags_of_evictd_run() {
    let readme = include_str!("../../README.md");
    let documented: BTreeSet<&str> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("| `--"))
        .filter_map(|row| {
            row.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .next()
        })
        .collect();
    let cli = Cli::command();
    let run = cli.find_subcommand("run").unwrap();
    let flags: BTreeSet<&str> = run
        .get_arguments()
        .filter_map(|argument| argument.get_long())
        .collect();
    let undocumented: Vec<_> = flags.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&flags).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "flags without a README row: {undocumented:?}; README rows naming no flag: {unknown:?}"
    );
    assert!(documented.len() > 40, "{documented:?}");
}
