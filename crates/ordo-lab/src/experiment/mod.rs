//! The experiment: the seed's 22 scenarios, the features beyond it, and the
//! HTTP transport's, on real processes and real files, compared field by field with the
//! protocol's expectations.

mod beyond;
pub(crate) mod child;
mod expect;
mod scenarios;
mod transport;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::LabError as Failure;
use beyond::BEYOND;
use child::{scenario_dir, Ctx};
use expect::differences;
use scenarios::{ScenarioFn, SEED};
use transport::TRANSPORT;

/// The scenario groups, reported apart: the seed's 22, then the features
/// beyond it, then the HTTP transport's.
const GROUPS: [(&str, &[(&str, ScenarioFn)]); 3] = [
    ("seed", &SEED),
    ("beyond", &BEYOND),
    ("transport", &TRANSPORT),
];

/// What the experiment runs.
#[derive(Debug, Clone)]
pub struct ExperimentOptions {
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
    /// Its group (`seed`, `beyond` or `transport`).
    pub group: &'static str,
    /// Its name.
    pub name: &'static str,
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

/// Every scenario run, in order.
#[derive(Debug, Clone)]
pub struct ExperimentReport {
    /// The scenarios' outcomes.
    pub scenarios: Vec<ScenarioResult>,
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
        GROUPS
            .iter()
            .map(|(group, _)| {
                let mine: Vec<&ScenarioResult> = self
                    .scenarios
                    .iter()
                    .filter(|r| r.group == *group)
                    .collect();
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

/// Runs the scenarios in order, each on its own files, calling `on_result`
/// after each.
pub fn run(
    options: &ExperimentOptions,
    on_result: &mut dyn FnMut(&ScenarioResult),
) -> Result<ExperimentReport, Failure> {
    for name in &options.only {
        if !GROUPS
            .iter()
            .any(|(_, list)| list.iter().any(|(n, _)| n == name))
        {
            return Err(Failure::Usage(format!("--only {name}: no such scenario")));
        }
    }
    let overrides = match &options.expected {
        Some(path) => expectations_from(path)?,
        None => Vec::new(),
    };
    let root = tempfile::Builder::new()
        .prefix("ordo-experiment-")
        .tempdir()
        .map_err(|e| Failure::Internal(format!("cannot create a temporary directory: {e}")))?;
    let mut scenarios = Vec::new();
    for (group, name, scenario) in GROUPS
        .iter()
        .flat_map(|(group, list)| list.iter().map(move |(name, f)| (*group, *name, *f)))
    {
        if !options.only.is_empty() && !options.only.iter().any(|n| n == name) {
            continue;
        }
        let ctx = Ctx {
            exe: options.exe.clone(),
            dir: scenario_dir(root.path(), name).map_err(Failure::Internal)?,
        };
        let override_ = overrides.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let result = run_one(group, name, scenario, &ctx, override_);
        on_result(&result);
        scenarios.push(result);
    }
    Ok(ExperimentReport { scenarios })
}

fn run_one(
    group: &'static str,
    name: &'static str,
    scenario: ScenarioFn,
    ctx: &Ctx,
    override_: Option<&Value>,
) -> ScenarioResult {
    let (observed, mut expected) = match scenario(ctx) {
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
        name,
        observed,
        expected,
        differences: found,
    }
}
