//! `ordo experiment`: the seed's 22 scenarios on real processes and real
//! files, compared field by field with the protocol's expectations.

mod beyond;
pub(crate) mod child;
mod expect;
mod scenarios;
pub mod worker;

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::args::ExperimentArgs;
use crate::context::emit;
use crate::Failure;
use beyond::BEYOND;
use child::{scenario_dir, Ctx};
use expect::differences;
use scenarios::{ScenarioFn, SEED};

/// The scenario groups, reported apart: the seed's 22, then the features beyond it.
const GROUPS: [(&str, &[(&str, ScenarioFn)]); 2] = [("seed", &SEED), ("beyond", &BEYOND)];

/// The exit status of the wrong control `unsafe_dual_write`, between its two
/// transactions.
pub const UNSAFE_EXIT_STATUS: i32 = 81;

struct Result_ {
    group: &'static str,
    name: &'static str,
    observed: Value,
    expected: Value,
    differences: Vec<String>,
}

/// Expectations read from an earlier report (`--expected FILE`), by scenario.
fn expectations_from(path: &PathBuf) -> Result<Vec<(String, Value)>, Failure> {
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

pub fn run(json_mode: bool, args: ExperimentArgs) -> Result<(), Failure> {
    for name in &args.only {
        if !GROUPS
            .iter()
            .any(|(_, list)| list.iter().any(|(n, _)| n == name))
        {
            return Err(Failure::Usage(format!("--only {name}: no such scenario")));
        }
    }
    let overrides = match &args.expected {
        Some(path) => expectations_from(path)?,
        None => Vec::new(),
    };
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Internal(format!("cannot find the ordo binary: {e}")))?;
    let root = tempfile::Builder::new()
        .prefix("ordo-experiment-")
        .tempdir()
        .map_err(|e| Failure::Internal(format!("cannot create a temporary directory: {e}")))?;
    let mut results = Vec::new();
    for (group, name, scenario) in GROUPS
        .iter()
        .flat_map(|(group, list)| list.iter().map(move |(name, f)| (*group, *name, *f)))
    {
        if !args.only.is_empty() && !args.only.iter().any(|n| n == name) {
            continue;
        }
        let dir = scenario_dir(root.path(), name).map_err(Failure::Internal)?;
        let ctx = Ctx {
            exe: exe.clone(),
            dir,
        };
        let (observed, mut expected) = match scenario(&ctx) {
            Ok(outcome) => (outcome.observed, outcome.expected),
            Err(error) => (json!({ "error": error }), json!({})),
        };
        if let Some((_, replacement)) = overrides.iter().find(|(n, _)| n == name) {
            expected = replacement.clone();
        }
        let mut found = differences(&expected, &observed);
        if let Some(error) = observed.get("error") {
            found.insert(0, format!("scenario failed to run: {error}"));
        }
        if !json_mode {
            eprintln!("{} {name}", if found.is_empty() { "pass" } else { "FAIL" });
        }
        results.push(Result_ {
            group,
            name,
            observed,
            expected,
            differences: found,
        });
    }
    let passed = results.iter().filter(|r| r.differences.is_empty()).count();
    let failed = results.len() - passed;
    let report = json!({
        "scenarios": results.iter().map(|r| json!({
            "name": r.name,
            "group": r.group,
            "passed": r.differences.is_empty(),
            "observed": r.observed,
            "expected": r.expected,
            "differences": r.differences,
        })).collect::<Vec<_>>(),
        "passed": passed,
        "failed": failed,
        "groups": GROUPS.iter().map(|(group, _)| {
            let mine: Vec<&Result_> = results.iter().filter(|r| r.group == *group).collect();
            let ok = mine.iter().filter(|r| r.differences.is_empty()).count();
            ((*group).to_owned(), json!({"passed": ok, "failed": mine.len() - ok}))
        }).collect::<serde_json::Map<_, _>>(),
    });
    if let Some(path) = &args.output {
        let text = serde_json::to_string_pretty(&report).expect("a JSON value serializes");
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::Internal(format!("cannot write {}: {e}", path.display())))?;
    }
    emit(json_mode, &report, || {
        let mut lines = Vec::new();
        for r in results.iter().filter(|r| !r.differences.is_empty()) {
            for d in &r.differences {
                lines.push(format!("{}: {d}", r.name));
            }
        }
        lines.push(format!("{passed} passed, {failed} failed"));
        lines.join("\n")
    });
    if args.check && failed > 0 {
        let first = results
            .iter()
            .find(|r| !r.differences.is_empty())
            .map(|r| format!("{}: {}", r.name, r.differences[0]))
            .unwrap_or_default();
        return Err(Failure::Check(format!(
            "{failed} scenario(s) failed; first: {first}"
        )));
    }
    Ok(())
}
