//! Every relative link in README.md and docs/**/*.md leads somewhere: the file or directory
//! exists, and a `#anchor` names a heading of the page as GitHub slugs it. No network, no root.

use e2e::plugins::repo_root;
use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The pages checked: README.md and every `.md` under docs/, relative to `root`.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("README.md")];
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let rel = dir.join(entry.file_name());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// A heading's anchor as GitHub makes it: link targets and code marks dropped, lower case,
/// punctuation other than `-` and `_` removed, spaces as `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find("](") {
        let Some(close) = rest[open..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        rest = &rest[open + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// One page's headings (as anchors, repeats numbered `-1`, `-2` as GitHub numbers them) and its
/// links (line number and target), code blocks and code spans left out.
fn read_page(text: &str) -> (Vec<String>, Vec<(usize, String)>) {
    let mut anchors = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut links = Vec::new();
    let mut fence = false;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim_end_matches('#'));
            let count = seen.entry(base.clone()).or_insert(0);
            anchors.push(match *count {
                0 => base.clone(),
                n => format!("{base}-{n}"),
            });
            *count += 1;
        }
        // Code spans are the odd-numbered pieces between backticks.
        for prose in line.split('`').step_by(2) {
            let mut rest = prose;
            while let Some(open) = rest.find("](") {
                let target = &rest[open + 2..];
                let Some(close) = target.find(')') else {
                    break;
                };
                links.push((number + 1, target[..close].to_string()));
                rest = &target[close..];
            }
        }
    }
    (anchors, links)
}

/// `path` relative to `root` with `.` and `..` taken out; None when it climbs out of `root`.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken relative link of the pages under `root`, as `page:line: target: why`.
fn broken_links(root: &Path) -> Vec<String> {
    let pages = pages(root);
    let mut anchors: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut links = Vec::new();
    for page in &pages {
        let text = fs::read_to_string(root.join(page))
            .unwrap_or_else(|e| panic!("reading {}: {e}", page.display()));
        let (page_anchors, page_links) = read_page(&text);
        anchors.insert(page.clone(), page_anchors);
        links.extend(page_links.into_iter().map(|(line, t)| (page, line, t)));
    }
    let mut broken = Vec::new();
    for (page, line, target) in links {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let dir = page.parent().unwrap_or(Path::new(""));
        let resolved = if file.is_empty() {
            Some(page.clone())
        } else {
            normalise(&dir.join(file))
        };
        let why = match &resolved {
            None => Some("leaves the repository".to_string()),
            Some(path) if !root.join(path).exists() => {
                Some(format!("{} does not exist", path.display()))
            }
            Some(path) => anchor.and_then(|anchor| {
                let found = match anchors.get(path) {
                    Some(list) => list.iter().any(|a| a == anchor),
                    // A page outside README.md and docs/: read it now.
                    None => fs::read_to_string(root.join(path))
                        .is_ok_and(|text| read_page(&text).0.iter().any(|a| a == anchor)),
                };
                (!found).then(|| {
                    format!(
                        "{} has no heading with the anchor #{anchor}",
                        path.display()
                    )
                })
            }),
        };
        if let Some(why) = why {
            broken.push(format!("{}:{line}: {target}: {why}", page.display()));
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_readme_and_docs_resolves() {
    let root = repo_root();
    let pages = pages(&root);
    assert!(pages.len() > 1, "no pages under {}/docs", root.display());
    let broken = broken_links(&root);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_missing_page_a_missing_anchor_and_a_link_out_of_the_repository_are_each_reported() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir_all(root.path().join("docs/reference")).unwrap();
    fs::write(
        root.path().join("README.md"),
        "# Top\n\nSee [flags](docs/reference/flags.md#the-flags-beside-gos) and \
         [gone](docs/gone.md), [out](../../etc/passwd), [web](https://example.com/x#y).\n\
         ```sh\n# not a heading\necho [x](nowhere.md)\n```\n`[code](nowhere.md)`\n",
    )
    .unwrap();
    fs::write(
        root.path().join("docs/reference/flags.md"),
        "# Flags\n\n## The flags, beside Go's\n\n## Exit status\n\n## Exit status\n\n\
         [up](../../README.md#top) [again](#exit-status-1) [not](#not-a-heading) \
         [wrong](#exit-status-2)\n",
    )
    .unwrap();
    assert_eq!(
        broken_links(root.path()),
        [
            "README.md:3: docs/gone.md: docs/gone.md does not exist",
            "README.md:3: ../../etc/passwd: leaves the repository",
            "docs/reference/flags.md:9: #not-a-heading: docs/reference/flags.md has no heading with the anchor #not-a-heading",
            "docs/reference/flags.md:9: #exit-status-2: docs/reference/flags.md has no heading with the anchor #exit-status-2",
        ]
    );
}
