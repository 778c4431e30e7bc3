//! The course as the workspace holds it: its files, its chapter crates, each chapter's book
//! page, and its lessons in the order the book numbers them.
//!
//! A chapter is a crate whose Cargo.toml says `[package.metadata.course] chapter = "N"`. Its
//! book page is the page of `book/` whose opening names its package. A lesson is a solution
//! region of the crate's `src/` (outside `exercises/`); the page's "Build it" section gives
//! each one a numbered subsection, `### 1.3 `allocate` in `kv_pool.rs``, in the order a
//! student writes them, and that number is the lesson's: its `todo!` says `chapter 1.3`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::exercise_stubs::strip_solutions;
use crate::solution_regions::{Region, regions};

/// Where a starter lists its own files: it has no `.git` to ask.
pub const STARTER_FILES: &str = ".starter-files";

/// A chapter's number as a sortable key: `3` is (3, 0), `6.2` is (6, 2).
pub type Key = (usize, usize);

pub fn chapter_key(id: &str) -> Option<Key> {
    match id.split_once('.') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok().filter(|&m| m > 0)?)),
        None => Some((id.parse().ok()?, 0)),
    }
}

pub fn label(key: Key) -> String {
    match key {
        (major, 0) => major.to_string(),
        (major, minor) => format!("{major}.{minor}"),
    }
}

/// A chapter crate: its number as written, its folder, its package and its book page.
#[derive(Debug, Clone)]
pub struct Chapter {
    pub id: String,
    pub dir: String,
    pub package: String,
    pub book: String,
}

/// One lesson: a solution region with its number in the chapter's book page.
#[derive(Debug, Clone)]
pub struct Lesson {
    /// `chapter 1.3`, the start of its `todo!` message.
    pub section: String,
    /// `1.3`, its subsection in the book.
    pub number: String,
    pub file: String,
    pub region: Region,
}

/// The workspace: its root, the files that make it, and its chapters by number.
pub struct Course {
    pub root: PathBuf,
    /// A starter, whose earlier chapters are a student's work, not the reference.
    pub in_starter: bool,
    pub files: Vec<String>,
    pub chapters: BTreeMap<Key, Chapter>,
}

impl Course {
    pub fn open(root: &Path) -> Result<Course, String> {
        let files = repo_files(root)?;
        let mut course = Course {
            root: root.to_path_buf(),
            in_starter: root.join(STARTER_FILES).is_file(),
            files,
            chapters: BTreeMap::new(),
        };
        course.chapters = course.find_chapters()?;
        Ok(course)
    }

    pub fn read(&self, file: &str) -> Result<String, String> {
        fs::read_to_string(self.root.join(file)).map_err(|e| format!("{file}: {e}"))
    }

    pub fn chapter(&self, key: Key) -> &Chapter {
        &self.chapters[&key]
    }

    /// Every chapter crate (`phaseN-name/` or a crate one folder below it) by number.
    fn find_chapters(&self) -> Result<BTreeMap<Key, Chapter>, String> {
        let pages: Vec<(String, String)> = self
            .files
            .iter()
            .filter(|f| f.starts_with("book/") && f.ends_with(".md"))
            .map(|f| Ok((f.clone(), self.read(f)?)))
            .collect::<Result<_, String>>()?;
        let mut chapters = BTreeMap::new();
        for file in &self.files {
            let parts: Vec<&str> = file.split('/').collect();
            let in_phase = parts[0].starts_with("phase") && matches!(parts.len(), 2 | 3);
            if !in_phase || parts.last() != Some(&"Cargo.toml") {
                continue;
            }
            let text = self.read(file)?;
            let Some(id) = manifest_value(&text, "package.metadata.course", "chapter") else {
                continue;
            };
            let package = manifest_value(&text, "package", "name")
                .ok_or_else(|| format!("{file}: no package name"))?;
            let key = chapter_key(&id).ok_or_else(|| format!("{file}: bad chapter {id:?}"))?;
            let opening = format!("package `{package}`");
            let book = pages
                .iter()
                .find(|(_, text)| text.lines().take(5).any(|l| l.contains(&opening)))
                .map(|(page, _)| page.clone())
                .ok_or_else(|| {
                    format!("chapter {id}: no page of book/ opens with \"{opening}\"")
                })?;
            let dir = file.trim_end_matches("/Cargo.toml").to_string();
            let chapter = Chapter {
                id,
                dir,
                package,
                book,
            };
            if let Some(other) = chapters.insert(key, chapter) {
                return Err(format!(
                    "{file}: chapter {} is also {}",
                    label(key),
                    other.dir
                ));
            }
        }
        Ok(chapters)
    }

    /// The lesson sources of a chapter, sorted; its exercises are apart.
    fn lesson_sources(&self, dir: &str) -> Vec<String> {
        let src = format!("{dir}/src/");
        let exercises = format!("{dir}/src/exercises/");
        let mut files: Vec<String> = self
            .files
            .iter()
            .filter(|f| f.starts_with(&src) && f.ends_with(".rs") && !f.starts_with(&exercises))
            .cloned()
            .collect();
        files.sort();
        files
    }

    /// The exercise files of a chapter, sorted.
    pub fn exercise_sources(&self, dir: &str) -> Vec<String> {
        let exercises = format!("{dir}/src/exercises/");
        let mut files: Vec<String> = self
            .files
            .iter()
            .filter(|f| f.starts_with(&exercises) && f.ends_with(".rs"))
            .cloned()
            .collect();
        files.sort();
        files
    }

    /// A chapter's lessons in the order its book page numbers them. Every region must have
    /// exactly one subsection and every subsection a region, numbered 1, 2, ... in order.
    pub fn lessons(&self, chapter: &Chapter) -> Result<Vec<Lesson>, String> {
        let mut found: Vec<(String, Region)> = Vec::new();
        for file in self.lesson_sources(&chapter.dir) {
            let text = self.read(&file)?;
            let in_file = regions(&text).map_err(|e| format!("{file}: {e}"))?;
            found.extend(in_file.into_iter().map(|r| (file.clone(), r)));
        }
        let headings = build_headings(&self.read(&chapter.book)?, &chapter.id)
            .map_err(|e| format!("{}: {e}", chapter.book))?;
        let mut lessons = Vec::new();
        for (k, (number, function, file)) in headings.iter().enumerate() {
            let expected = format!("{}.{}", chapter.id, k + 1);
            if *number != expected {
                return Err(format!(
                    "{}: subsection {number} should be {expected}: lessons are numbered 1, 2, ... in order",
                    chapter.book
                ));
            }
            let path = format!("{}/src/{file}", chapter.dir);
            let at = found
                .iter()
                .position(|(f, r)| *f == path && r.function == *function)
                .ok_or_else(|| {
                    format!(
                        "{}: subsection {number} names `{function}` in `{file}`, which has no \
                         solution region there (or it has one subsection already)",
                        chapter.book
                    )
                })?;
            let (file, region) = found.remove(at);
            lessons.push(Lesson {
                section: format!("chapter {number}"),
                number: number.clone(),
                file,
                region,
            });
        }
        if let Some((file, region)) = found.first() {
            return Err(format!(
                "{file}: the lesson `{}` has no \"### {}.k `{}` in `...`\" subsection in {}",
                region.function, chapter.id, region.function, chapter.book
            ));
        }
        Ok(lessons)
    }

    /// Each exercise `todo!` message of a chapter, with its file, in the book's order.
    pub fn exercises(&self, chapter: &Chapter) -> Result<Vec<(String, String)>, String> {
        let mut all = Vec::new();
        for file in self.exercise_sources(&chapter.dir) {
            let text = self.read(&file)?;
            let (_, todos) = strip_solutions(&text).map_err(|e| format!("{file}: {e}"))?;
            all.extend(todos.into_iter().map(|t| (file.clone(), t)));
        }
        all.sort_by_key(|(_, todo)| exercise_number(todo));
        Ok(all)
    }
}

/// The lesson subsections of a book page: `### 1.3 `allocate` in `kv_pool.rs`` gives
/// ("1.3", "allocate", "kv_pool.rs"). The first code span names the function (`Type::name`
/// is allowed), a later one ending in `.rs` its file below the crate's `src/`.
pub fn build_headings(page: &str, chapter: &str) -> Result<Vec<(String, String, String)>, String> {
    let prefix = format!("{chapter}.");
    let mut out = Vec::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("### ") else {
            continue;
        };
        let number = rest.split_whitespace().next().unwrap_or("");
        let is_lesson = number
            .strip_prefix(&prefix)
            .is_some_and(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()));
        if !is_lesson {
            continue;
        }
        let spans: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
        let function = spans
            .first()
            .map(|s| s.rsplit("::").next().unwrap_or(s).trim_end_matches("()"))
            .filter(|f| !f.is_empty());
        let file = spans.iter().skip(1).find(|s| s.ends_with(".rs"));
        match (function, file) {
            (Some(function), Some(file)) => {
                out.push((number.to_string(), function.to_string(), file.to_string()))
            }
            _ => {
                return Err(format!(
                    "\"{line}\" should read \"### {number} `function` in `file.rs`\""
                ));
            }
        }
    }
    Ok(out)
}

/// `exercise 4.2: ...` -> [4, 2] and `exercise 6.3.1: ...` -> [6, 3, 1], for listing exercises
/// in the book's order.
pub fn exercise_number(todo: &str) -> Vec<usize> {
    let number = todo
        .strip_prefix("exercise ")
        .and_then(|t| t.split(':').next())
        .unwrap_or("");
    number
        .split('.')
        .map(|n| n.parse().unwrap_or(usize::MAX))
        .collect()
}

/// The string value of `key` in the `[table]` of a Cargo.toml.
pub fn manifest_value(text: &str, table: &str, key: &str) -> Option<String> {
    let mut current = "";
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name;
        } else if current == table
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            return Some(v.trim().trim_matches('"').to_string());
        }
    }
    None
}

/// The files that make the workspace: those git tracks (never a stray local file or build
/// output), or in a starter, which has no `.git`, the files it was written with.
fn repo_files(root: &Path) -> Result<Vec<String>, String> {
    let listed = root.join(STARTER_FILES);
    let names: Vec<String> = if listed.is_file() {
        fs::read_to_string(&listed)
            .map_err(|e| format!("{STARTER_FILES}: {e}"))?
            .lines()
            .map(str::to_string)
            .collect()
    } else {
        let out = Command::new("git")
            .args(["ls-files", "--cached", "-z"])
            .current_dir(root)
            .output()
            .map_err(|e| format!("cannot run git: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{} is neither a git checkout of nano-serving nor a starter (no {STARTER_FILES}): \
                 git ls-files says {}",
                root.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .map(str::to_string)
            .collect()
    };
    Ok(names
        .into_iter()
        .filter(|f| !f.is_empty() && root.join(f).is_file())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lesson_subsections_give_number_function_and_file() {
        let page = "## Build it\n\n### 1.1 `FreeQueue::push_back` in `free_queue.rs`\n\ntext\n\n\
                    ### 1.2 `allocate()` in `kv_pool.rs`\n### 1.2.1 not a lesson of chapter 1\n\
                    ### Exercises\n";
        assert_eq!(
            build_headings(page, "1").unwrap(),
            [
                ("1.1".into(), "push_back".into(), "free_queue.rs".into()),
                ("1.2".into(), "allocate".into(), "kv_pool.rs".into())
            ]
        );
        assert_eq!(
            build_headings("### 6.2.1 `plan_cascade` in `cascade.rs`", "6.2").unwrap(),
            [("6.2.1".into(), "plan_cascade".into(), "cascade.rs".into())]
        );
        assert!(build_headings("### 1.3 `allocate` somewhere", "1").is_err());
    }

    #[test]
    fn chapter_numbers_sort_and_print_back() {
        assert_eq!(chapter_key("3"), Some((3, 0)));
        assert_eq!(chapter_key("6.2"), Some((6, 2)));
        assert_eq!(chapter_key("6.0"), None);
        assert_eq!(label((6, 2)), "6.2");
        assert_eq!(label((3, 0)), "3");
        assert_eq!(exercise_number("exercise 6.3.1: a bucket"), [6, 3, 1]);
    }
}
