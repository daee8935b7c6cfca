//! The experiment: the seed's 22 scenarios, the features beyond it, and
//! those of each transport with a network hop, on real processes and real
//! stores (two SQLite files, or a PostgreSQL database, of each scenario's
//! own), compared field by field with the protocol's expectations.

mod beyond;
pub(crate) mod child;
mod expect;
mod scenarios;
mod topology;
mod transport;

use std::path::{Path, PathBuf};

/// The PostgreSQL server of `--backend postgres`, shared with the soak.
pub use crate::pg;

use serde_json::{json, Value};

use crate::LabError as Failure;
use beyond::BEYOND;
use child::{scenario_dir, Ctx, Stores};
use expect::differences;
use scenarios::{Outcome, ScenarioFn, SEED};

/// How a scenario runs, on its own stores.
type RunFn = Box<dyn Fn(&Ctx) -> Result<Outcome, String>>;

/// One scenario: its name and how it runs.
pub(crate) struct Scenario {
    name: String,
    run: RunFn,
}

/// The scenario groups, reported apart: the seed's 22, then the features
/// beyond it, then those of every transport with a network hop (built from
/// the lab's list of transports), then those of many producers and
/// consumers.
fn groups() -> [(&'static str, Vec<Scenario>); 4] {
    let listed = |list: &[(&'static str, ScenarioFn)]| -> Vec<Scenario> {
        list.iter()
            .map(|&(name, run)| Scenario {
                name: name.to_owned(),
                run: Box::new(run),
            })
            .collect()
    };
    [
        ("seed", listed(&SEED)),
        ("beyond", listed(&BEYOND)),
        ("transport", transport::scenarios()),
        ("topology", listed(&topology::TOPOLOGY)),
    ]
}

/// Every scenario's group and name, in the order they run.
#[cfg(test)]
pub(crate) fn scenario_names() -> Vec<(&'static str, String)> {
    groups()
        .into_iter()
        .flat_map(|(group, list)| list.into_iter().map(move |s| (group, s.name)))
        .collect()
}

/// Where the scenarios' stores live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Two SQLite files in a temporary directory per scenario.
    Sqlite,
    /// A fresh database per scenario on the PostgreSQL server of this URL
    /// (its database, if any, is only where the run connects to create and
    /// drop the others).
    Postgres {
        /// The server's URL.
        url: String,
    },
}

impl Backend {
    /// `sqlite` or `postgres`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres { .. } => "postgres",
        }
    }
}

/// Scenarios that cannot run on PostgreSQL, with the reason: they are about
/// what only an SQLite file has.
const NOT_ON_POSTGRES: [(&str, &str); 2] = [
    (
        "transient_failure_backs_off",
        "makes the consumer transiently busy by holding its SQLite file's write lock \
         (--busy-timeout-ms); a PostgreSQL store has no file lock, and a lock held on \
         its tables makes a receive wait, not fail",
    ),
    topology::SQLITE_ONLY[0],
];

/// Why `name` cannot run on `backend`, if it cannot.
fn not_applicable(backend: &Backend, name: &str) -> Option<&'static str> {
    match backend {
        Backend::Sqlite => None,
        Backend::Postgres { .. } => NOT_ON_POSTGRES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, reason)| *reason),
    }
}

/// What the experiment runs.
#[derive(Debug, Clone)]
pub struct ExperimentOptions {
    /// Where the stores live.
    pub backend: Backend,
    /// The `ordo` binary the scenarios run.
    pub exe: PathBuf,
    /// Only these scenarios (all if empty); an unknown name is refused.
    pub only: Vec<String>,
    /// Compare against the `expected` values of this earlier report instead
    /// of the built-in ones.
    pub expected: Option<PathBuf>,
}

/// One scenario's outcome.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// Its group (`seed`, `beyond`, `transport` or `topology`).
    pub group: &'static str,
    /// Its name.
    pub name: String,
    /// What it observed (`{"error": ..}` when it could not run).
    pub observed: Value,
    /// What the protocol expects.
    pub expected: Value,
    /// Every differing field; empty when it passed.
    pub differences: Vec<String>,
}

impl ScenarioResult {
    /// Whether it observed what was expected.
    pub fn passed(&self) -> bool {
        self.differences.is_empty()
    }
}

/// A scenario that was not run because it cannot apply to the backend.
#[derive(Debug, Clone)]
pub struct NotApplicable {
    /// Its group.
    pub group: &'static str,
    /// Its name.
    pub name: String,
    /// Why it cannot apply.
    pub reason: &'static str,
}

/// Every scenario run, in order.
#[derive(Debug, Clone)]
pub struct ExperimentReport {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The PostgreSQL server, without a password (`None` on SQLite).
    pub server: Option<String>,
    /// The scenarios' outcomes.
    pub scenarios: Vec<ScenarioResult>,
    /// The scenarios selected but not run, because they cannot apply to
    /// the backend; neither passed nor failed.
    pub not_applicable: Vec<NotApplicable>,
}

/// One group's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCounts {
    /// The group's name.
    pub group: &'static str,
    /// Scenarios that passed.
    pub passed: usize,
    /// Scenarios that failed.
    pub failed: usize,
}

impl ExperimentReport {
    /// Scenarios that passed.
    pub fn passed(&self) -> usize {
        self.scenarios.iter().filter(|r| r.passed()).count()
    }

    /// Scenarios that failed.
    pub fn failed(&self) -> usize {
        self.scenarios.len() - self.passed()
    }

    /// The counts of every group, whether any of its scenarios ran or not.
    pub fn groups(&self) -> Vec<GroupCounts> {
        groups()
            .into_iter()
            .map(|(group, _)| {
                let mine: Vec<&ScenarioResult> =
                    self.scenarios.iter().filter(|r| r.group == group).collect();
                let passed = mine.iter().filter(|r| r.passed()).count();
                GroupCounts {
                    group,
                    passed,
                    failed: mine.len() - passed,
                }
            })
            .collect()
    }
}

/// Expectations read from an earlier report (`--expected FILE`), by scenario.
fn expectations_from(path: &Path) -> Result<Vec<(String, Value)>, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Usage(format!("--expected {}: cannot read: {e}", path.display())))?;
    let report: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Usage(format!("--expected {}: not JSON: {e}", path.display())))?;
    let scenarios = report["scenarios"].as_array().ok_or_else(|| {
        Failure::Usage(format!(
            "--expected {}: no \"scenarios\" array",
            path.display()
        ))
    })?;
    scenarios
        .iter()
        .map(|s| match (s["name"].as_str(), s.get("expected")) {
            (Some(name), Some(expected)) => Ok((name.to_owned(), expected.clone())),
            _ => Err(Failure::Usage(format!(
                "--expected {}: every scenario needs \"name\" and \"expected\"",
                path.display()
            ))),
        })
        .collect()
}

/// Runs the scenarios in order, each on its own stores (two files, or a
/// database of its own), calling `on_result` after each.
pub fn run(
    options: &ExperimentOptions,
    on_result: &mut dyn FnMut(&ScenarioResult),
) -> Result<ExperimentReport, Failure> {
    let groups = groups();
    for name in &options.only {
        if !groups
            .iter()
            .any(|(_, list)| list.iter().any(|s| s.name == *name))
        {
            return Err(Failure::Usage(format!("--only {name}: no such scenario")));
        }
    }
    let overrides = match &options.expected {
        Some(path) => expectations_from(path)?,
        None => Vec::new(),
    };
    let server = match &options.backend {
        Backend::Sqlite => None,
        Backend::Postgres { url } => Some(pg::Server::connect(url, pg::EXPERIMENT_PREFIX)?),
    };
    let root = tempfile::Builder::new()
        .prefix("ordo-experiment-")
        .tempdir()
        .map_err(|e| Failure::Internal(format!("cannot create a temporary directory: {e}")))?;
    let mut scenarios = Vec::new();
    let mut skipped = Vec::new();
    for (group, scenario) in groups
        .iter()
        .flat_map(|(group, list)| list.iter().map(move |s| (*group, s)))
    {
        let name = scenario.name.as_str();
        if !options.only.is_empty() && !options.only.iter().any(|n| n == name) {
            continue;
        }
        if let Some(reason) = not_applicable(&options.backend, name) {
            skipped.push(NotApplicable {
                group,
                name: name.to_owned(),
                reason,
            });
            continue;
        }
        // Dropped at the end of this iteration, whatever the outcome.
        let database = match &server {
            Some(server) => Some(server.create()?),
            None => None,
        };
        let ctx = Ctx {
            exe: options.exe.clone(),
            dir: scenario_dir(root.path(), name).map_err(Failure::Internal)?,
            stores: match &database {
                Some(database) => Stores::Postgres(database.url()),
                None => Stores::Files,
            },
        };
        let override_ = overrides.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let result = run_one(group, scenario, &ctx, override_);
        drop(database);
        on_result(&result);
        scenarios.push(result);
    }
    Ok(ExperimentReport {
        backend: options.backend.as_str(),
        server: server.as_ref().map(|s| s.shown().to_owned()),
        scenarios,
        not_applicable: skipped,
    })
}

fn run_one(
    group: &'static str,
    scenario: &Scenario,
    ctx: &Ctx,
    override_: Option<&Value>,
) -> ScenarioResult {
    let (observed, mut expected) = match (scenario.run)(ctx) {
        Ok(outcome) => (outcome.observed, outcome.expected),
        Err(error) => (json!({ "error": error }), json!({})),
    };
    if let Some(replacement) = override_ {
        expected = replacement.clone();
    }
    let mut found = differences(&expected, &observed);
    if let Some(error) = observed.get("error") {
        found.insert(0, format!("scenario failed to run: {error}"));
    }
    ScenarioResult {
        group,
        name: scenario.name.clone(),
        observed,
        expected,
        differences: found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_not_applicable_on_postgresql_exists() {
        for (name, reason) in NOT_ON_POSTGRES {
            assert!(
                groups()
                    .iter()
                    .any(|(_, list)| list.iter().any(|s| s.name == name)),
                "no scenario {name}"
            );
            assert!(!reason.is_empty());
            let postgres = Backend::Postgres { url: String::new() };
            assert_eq!(not_applicable(&postgres, name), Some(reason));
            assert_eq!(not_applicable(&Backend::Sqlite, name), None);
        }
    }
}
