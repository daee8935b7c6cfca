//! `ordo-shape [ROOT]`: checks the shape rule over `ROOT/crates/*/src`
//! (the current folder by default), leaving out the harness crates. Prints
//! every function and file over its limit and exits 1 if there is one, 2
//! if a file cannot be read or parsed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ordo_shape::{measure, FILE_LINES_MAX, FN_LINES_MAX};

/// Crates that are test and measurement harnesses, not production code.
const HARNESS_CRATES: [&str; 3] = ["ordo-testkit", "ordo-lab", "ordo-faults"];

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let root = PathBuf::from(args.next().unwrap_or_else(|| ".".to_owned()));
    if args.next().is_some() {
        eprintln!("usage: ordo-shape [ROOT]");
        return ExitCode::from(2);
    }
    match check(&root) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(message) => {
            eprintln!("ordo-shape: {message}");
            ExitCode::from(2)
        }
    }
}

/// Prints what is over a limit and returns how many such places there are.
fn check(root: &Path) -> Result<usize, String> {
    let files = production_files(root)?;
    if files.is_empty() {
        return Err(format!("no production source under {}", root.display()));
    }
    let mut over = 0;
    let (mut functions, mut lines) = (0, 0);
    for path in &files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let shape = measure(&text).map_err(|e| format!("{}:{e}", path.display()))?;
        let shown = path.strip_prefix(root).unwrap_or(path).display();
        lines += shape.code_lines;
        if shape.code_lines > FILE_LINES_MAX {
            println!(
                "file {shown}: {} code lines (max {FILE_LINES_MAX})",
                shape.code_lines
            );
            over += 1;
        }
        for f in shape.functions {
            functions += 1;
            if f.code_lines > FN_LINES_MAX {
                println!(
                    "fn {shown}:{} {}: {} code lines (max {FN_LINES_MAX})",
                    f.line, f.name, f.code_lines
                );
                over += 1;
            }
        }
    }
    println!(
        "{} files, {functions} functions, {lines} code lines; {over} over the limits",
        files.len()
    );
    Ok(over)
}

/// Every `.rs` file under `crates/*/src` of a crate that is not a harness,
/// in a stable order.
fn production_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let crates = root.join("crates");
    let mut files = Vec::new();
    for entry in read_dir(&crates)? {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !HARNESS_CRATES.contains(&name) && entry.join("src").is_dir() {
            walk(&entry.join("src"), &mut files)?;
        }
    }
    files.sort();
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    for path in read_dir(dir)? {
        if path.is_dir() {
            walk(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    entries
        .map(|e| {
            e.map(|e| e.path())
                .map_err(|e| format!("{}: {e}", dir.display()))
        })
        .collect()
}
