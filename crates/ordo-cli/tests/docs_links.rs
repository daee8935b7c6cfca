//! The documentation a newcomer reads holds together: every relative link
//! and image of README.md, ARCHITECTURE.md and docs/*.md names a file that
//! exists, every `#anchor` names a heading of its target page (by GitHub's
//! slug), every guide under docs/ is linked from the README, and the README
//! stays short.
//!
//! Links inside fenced code blocks and code spans are not links and are
//! left alone; `http(s)://` and `mailto:` targets are not checked.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The most lines README.md may have, as `wc -l` counts them.
const README_LINES_MAX: usize = 160;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The pages checked, relative to the root: README.md, ARCHITECTURE.md and
/// every docs/*.md, in a stable order.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    pages.extend(guides());
    pages
}

/// Every docs/*.md, relative to the root, sorted.
fn guides() -> Vec<PathBuf> {
    let dir = root().join("docs");
    let mut guides: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| Path::new("docs").join(path.file_name().expect("a file name")))
        .collect();
    guides.sort();
    guides
}

fn read(page: &Path) -> String {
    let path = root().join(page);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// GitHub's anchor for a heading: lower-case, each space a `-`, every
/// character but letters, digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Whether `line` opens or closes a fenced code block.
fn is_fence(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("```") || line.starts_with("~~~")
}

/// The text with fenced code blocks and code spans blanked out (each of
/// their characters but line breaks made a space), so that nothing in
/// them reads as a link or a heading and every offset keeps its line.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.split_inclusive('\n') {
        let fence = is_fence(line);
        if fenced || fence {
            out.extend(line.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(line);
        }
        if fence {
            fenced = !fenced;
        }
    }
    blank_code_spans(&out)
}

/// Blanks every code span: a run of backticks up to the next run of the
/// same length (which may be on a later line of the paragraph).
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let open = run_at(i);
        let mut j = i + open;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let run = run_at(j);
                if run == open {
                    close = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + open] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + open;
            }
            None => i += open,
        }
    }
    out.into_iter().collect()
}

/// One link or image of a page: the line it starts on, its text and its
/// target as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    line: usize,
    text: String,
    target: String,
}

/// Every inline link and image `[text](target)` of a page's prose. The
/// text may span lines and hold brackets; the target ends at the first
/// space (a title may follow) or at its closing parenthesis.
fn links(text: &str) -> Vec<Link> {
    // Blanking keeps every character's place, so the link's own text can be
    // read from the page as written.
    let written: Vec<char> = text.chars().collect();
    let chars: Vec<char> = prose(text).chars().collect();
    assert_eq!(written.len(), chars.len(), "blanking keeps every place");
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '[' {
            i += 1;
            continue;
        }
        let Some(close) = matching(&chars, i, '[', ']') else {
            i += 1;
            continue;
        };
        if chars.get(close + 1) != Some(&'(') {
            i += 1;
            continue;
        }
        let Some(end) = matching(&chars, close + 1, '(', ')') else {
            i += 1;
            continue;
        };
        let inside: String = chars[close + 2..end].iter().collect();
        let target = inside.split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        found.push(Link {
            line: 1 + chars[..i].iter().filter(|&&c| c == '\n').count(),
            text: written[i + 1..close]
                .iter()
                .collect::<String>()
                .replace('\n', " "),
            target: target.to_owned(),
        });
        // The text of a link may hold an image; look inside it too.
        i += 1;
    }
    found
}

/// The index of the bracket that closes the one at `open`, counting nested
/// pairs; a target (`(`) may not span lines.
fn matching(chars: &[char], open: usize, left: char, right: char) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        if c == left {
            depth += 1;
        } else if c == right {
            depth -= 1;
            if depth == 0 {
                return Some(k);
            }
        } else if c == '\n' && left == '(' {
            return None;
        } else if c == '\n' && k > 0 && chars[k - 1] == '\n' {
            return None; // a blank line ends the paragraph
        }
    }
    None
}

/// The anchors of a page's headings, with GitHub's `-1`, `-2`, ... for a
/// slug seen before.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if is_fence(line) {
            fenced = !fenced;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if fenced || !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let heading = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while !anchors.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    anchors
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.to_ascii_lowercase().starts_with(scheme))
}

/// The page a relative link of `page` leads to, relative to the root, and
/// its anchor if any. `None` for an external link.
fn resolve(page: &Path, target: &str) -> Option<(PathBuf, Option<String>)> {
    if is_external(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor.to_owned())),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        page.to_path_buf()
    } else {
        normalize(&page.parent().unwrap_or(Path::new("")).join(path))
    };
    Some((resolved, anchor))
}

/// What is wrong with one link of `page`, if anything.
fn broken(page: &Path, link: &Link) -> Option<String> {
    if link.target.is_empty() {
        return Some("empty target".into());
    }
    let (path, anchor) = resolve(page, &link.target)?;
    if !root().join(&path).exists() {
        return Some(format!("no such file: {}", path.display()));
    }
    let anchor = anchor?;
    if path.extension().is_none_or(|ext| ext != "md") {
        return Some(format!(
            "#{anchor} on {}, which is not a markdown page",
            path.display()
        ));
    }
    let known = anchors(&read(&path));
    if known.contains(&anchor) {
        return None;
    }
    Some(format!(
        "{} has no heading whose anchor is #{anchor}",
        path.display()
    ))
}

#[test]
fn slugs_are_githubs() {
    let table = [
        ("Set up", "set-up"),
        ("Running on PostgreSQL", "running-on-postgresql"),
        (
            "The console on 100,000 flows",
            "the-console-on-100000-flows",
        ),
        (
            "S_pg: the protocol's rows alone",
            "s_pg-the-protocols-rows-alone",
        ),
        (
            "10. The experiment (22 scenarios)",
            "10-the-experiment-22-scenarios",
        ),
        ("`POST /v1/events`", "post-v1events"),
        (
            "On PostgreSQL: `process_all` and `drain`",
            "on-postgresql-process_all-and-drain",
        ),
        (
            "What the `Runner`'s loop does",
            "what-the-runners-loop-does",
        ),
        ("Bird's eye view", "birds-eye-view"),
        ("JSON shapes (with `--json`)", "json-shapes-with---json"),
        ("Two  spaces", "two--spaces"),
        ("  Trimmed  ", "trimmed"),
        ("Ünïcode letters stay", "ünïcode-letters-stay"),
    ];
    let wrong: Vec<String> = table
        .iter()
        .filter(|(heading, want)| slug(heading) != *want)
        .map(|(heading, want)| format!("{heading:?}: {:?}, expected {want:?}", slug(heading)))
        .collect();
    assert!(wrong.is_empty(), "slugs differ:\n{}", wrong.join("\n"));
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "\
See [the guide](docs/a.md) and ![a picture](img/b.png \"title\").
A [link over
two lines](c.md#part), `[not](a-link.md)`, [text] (not.md), [x]<y>.

```sh
echo '[not](either.md)'
```
~~~
[nor](this.md)
~~~
[`code` in text](d.md) and [brackets [inside]](e.md).
";
    let found: Vec<(usize, String, String)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target, l.text))
        .collect();
    let want: Vec<(usize, String, String)> = [
        (1, "docs/a.md", "the guide"),
        (1, "img/b.png", "a picture"),
        (2, "c.md#part", "link over two lines"),
        (11, "d.md", "`code` in text"),
        (11, "e.md", "brackets [inside]"),
    ]
    .into_iter()
    .map(|(line, target, text)| (line, target.to_owned(), text.to_owned()))
    .collect();
    assert_eq!(found, want);
}

#[test]
fn headings_give_anchors_with_githubs_suffixes() {
    let text = "# Title\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n#not either\n### `code` here ###\n";
    let want: BTreeSet<String> = ["title", "notes", "notes-1", "code-here"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(anchors(text), want);
}

#[test]
fn every_link_and_image_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for link in links(&read(&page)) {
            checked += 1;
            if let Some(problem) = broken(&page, &link) {
                problems.push(format!(
                    "{}:{}: [{}]({}): {problem}",
                    page.display(),
                    link.line,
                    link.text,
                    link.target
                ));
            }
        }
    }
    assert!(checked > 0, "no link found in {:?}", pages());
    assert!(
        problems.is_empty(),
        "{} broken link(s) of {checked}:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_guide_is_linked_from_the_readme() {
    let readme = Path::new("README.md");
    let linked: BTreeSet<PathBuf> = links(&read(readme))
        .iter()
        .filter_map(|link| resolve(readme, &link.target))
        .map(|(path, _)| path)
        .collect();
    let unlinked: Vec<String> = guides()
        .into_iter()
        .filter(|guide| !linked.contains(guide))
        .map(|guide| guide.display().to_string())
        .collect();
    assert!(
        unlinked.is_empty(),
        "README.md links to none of these guides:\n{}",
        unlinked.join("\n")
    );
}

#[test]
fn the_readme_is_short() {
    let lines = read(Path::new("README.md")).matches('\n').count();
    assert!(
        lines <= README_LINES_MAX,
        "README.md has {lines} lines (as `wc -l` counts them), more than {README_LINES_MAX}: move the detail into a guide under docs/"
    );
}
