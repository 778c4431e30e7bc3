//! Writing a chapter's starter workspace: the workspace's files with the lessons of that
//! chapter and every later one turned into `todo!`s, every exercise answer cut, and the
//! pages a student reads first (`STARTER.md`, `README.md`) written for that chapter.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use crate::course::{Course, Key, Lesson, STARTER_FILES, exercise_number, label, manifest_value};
use crate::exercise_stubs::strip_solutions;
use crate::solution_regions::replace_regions;

/// What a starter holds: the lessons of its chapter and of later ones, every exercise stub.
pub struct Written {
    pub own: Vec<Lesson>,
    pub later: Vec<(Key, Vec<Lesson>)>,
    pub exercises: Vec<(Key, Vec<(String, String)>)>,
}

/// Appended to the starter's `.cargo/config.toml`. While bodies are `todo!`s every property
/// test fails on its first case: shrinking would re-run it hundreds of times, printing the same
/// panic each time, and persisting failures would write files into the student's tree.
const STARTER_ENV: &str = "
# Written by `cargo xtask starter`. While a chapter's bodies are `todo!`s, a property test fails
# on its first case: no shrinking (each shrink step would print the same panic again) and no
# `*.proptest-regressions` file. A snapshot that differs fails and shows the difference without
# writing a `.snap.new`: the committed snapshot is the reference's output, never re-record it.
# Once your code runs, delete the PROPTEST_MAX_SHRINK_ITERS line to get minimal failing inputs.
[env]
PROPTEST_MAX_SHRINK_ITERS = \"0\"
PROPTEST_DISABLE_FAILURE_PERSISTENCE = \"1\"
INSTA_UPDATE = \"no\"
";

/// Writes the starter of chapter `phase` to `out`. `stamp` goes into the workspace version
/// (`0.1.0+starter.<stamp>`): cargo tells a build of one starter's crates from another's
/// by version, never by folder, so starters sharing a `CARGO_TARGET_DIR` would otherwise run
/// each other's code.
pub fn write_starter(
    course: &Course,
    phase: Key,
    out: &Path,
    stamp: &str,
) -> Result<Written, String> {
    let mut replaced: BTreeMap<String, String> = BTreeMap::new();
    let mut written = Written {
        own: Vec::new(),
        later: Vec::new(),
        exercises: Vec::new(),
    };
    for (&key, chapter) in &course.chapters {
        for file in course.exercise_sources(&chapter.dir) {
            let (new, _) =
                strip_solutions(&course.read(&file)?).map_err(|e| format!("{file}: {e}"))?;
            replaced.insert(file, new);
        }
        let exercises = course.exercises(chapter)?;
        if !exercises.is_empty() {
            written.exercises.push((key, exercises));
        }
    }
    for (&key, chapter) in course.chapters.range(phase..) {
        let lessons = course.lessons(chapter)?;
        let mut by_file: BTreeMap<&str, Vec<&Lesson>> = BTreeMap::new();
        for lesson in &lessons {
            by_file.entry(&lesson.file).or_default().push(lesson);
        }
        for (file, mut in_file) in by_file {
            let text = course.read(file)?;
            // The regions of a file in source order get their numbers from the book.
            let order = crate::solution_regions::regions(&text)?;
            let mut sections = Vec::new();
            for region in &order {
                let at = in_file
                    .iter()
                    .position(|l| l.region == *region)
                    .ok_or_else(|| format!("{file}: `{}` has no lesson", region.function))?;
                sections.push(in_file.remove(at).section.clone());
            }
            let new = replace_regions(&text, &sections).map_err(|e| format!("{file}: {e}"))?;
            replaced.insert(file.to_string(), new);
        }
        if key == phase {
            written.own = lessons;
        } else {
            written.later.push((key, lessons));
        }
    }
    replaced.insert(
        "Cargo.toml".into(),
        stamp_version(&course.read("Cargo.toml")?, stamp)?,
    );
    let config = ".cargo/config.toml";
    let mut cargo_config = course.read(config).unwrap_or_default();
    if !cargo_config.contains("[env]") {
        cargo_config.push_str(STARTER_ENV);
    }
    replaced.insert(config.into(), cargo_config);
    replaced.insert("README.md".into(), readme(course, phase)?);
    replaced.insert("STARTER.md".into(), guide(course, phase, &written));

    let mut files: Vec<String> = course.files.clone();
    files.extend(replaced.keys().cloned());
    files.sort();
    files.dedup();
    files.retain(|f| f != STARTER_FILES);
    for file in &files {
        let dst = out.join(file);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        match replaced.get(file) {
            Some(text) => fs::write(&dst, text),
            None => fs::copy(course.root.join(file), &dst).map(|_| ()),
        }
        .map_err(|e| format!("{}: {e}", dst.display()))?;
    }
    let mut list = files.join("\n");
    list.push('\n');
    fs::write(out.join(STARTER_FILES), list).map_err(|e| format!("{STARTER_FILES}: {e}"))?;
    Ok(written)
}

/// The root manifest with `version` of `[workspace.package]` stamped `+starter.<stamp>`.
fn stamp_version(manifest: &str, stamp: &str) -> Result<String, String> {
    let version = manifest_value(manifest, "workspace.package", "version")
        .ok_or("Cargo.toml: no version in [workspace.package]")?;
    let base = version.split('+').next().unwrap_or(&version);
    let mut table = "";
    let mut out = String::with_capacity(manifest.len() + 32);
    for line in manifest.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            table = name;
        }
        let is_version = table == "workspace.package"
            && trimmed
                .split_once('=')
                .is_some_and(|(k, _)| k.trim() == "version");
        if is_version {
            writeln!(out, "version = \"{base}+starter.{stamp}\"").unwrap();
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// `STARTER.md`: where to start, this chapter's todos in order, then the rest counted apart.
fn guide(course: &Course, phase: Key, written: &Written) -> String {
    let chapter = course.chapter(phase);
    let mut g = String::new();
    let id = &chapter.id;
    writeln!(g, "# Starter workspace: chapter {id}\n").unwrap();
    if written.own.is_empty() {
        writeln!(
            g,
            "Chapter {id} (package `{}`, [{}]({})) has no todo! of its own: read it, run its \
             \"Try it\", then do its exercises.",
            chapter.package, chapter.book, chapter.book
        )
        .unwrap();
    } else {
        writeln!(
            g,
            "Chapter {id} (package `{}`) has **{} todo!s**. Write them in this order, starting \
             with {}: each number is a subsection of \"Build it\" in [{}]({}), which says what \
             to write and which tests check it. `cargo test -p {}` fails, each failure naming \
             its todo, until all are written.\n\n\
             Write each body between its `// BEGIN SOLUTION` and `// END SOLUTION` lines and \
             keep those lines: `cargo xtask starter` run in this workspace finds your code by \
             them.\n",
            chapter.package,
            written.own.len(),
            written.own[0].number,
            chapter.book,
            chapter.book,
            chapter.package
        )
        .unwrap();
        for l in &written.own {
            writeln!(
                g,
                "- **{}** `{}` in `{}`: {}",
                l.number, l.region.function, l.file, l.region.hint
            )
            .unwrap();
        }
    }
    let exercises_of = |key: Key| {
        written
            .exercises
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, e)| e.as_slice())
            .unwrap_or_default()
    };
    let own_exercises = exercises_of(phase);
    if !own_exercises.is_empty() {
        writeln!(
            g,
            "\n## Chapter {id}'s exercises\n\nOnce the chapter's tests pass: `cargo test -p {} \
             --features exercises --test exercises` ({} exercises, {} todo!s; the chapter's \
             page says what each test checks).\n",
            chapter.package,
            count_exercises(own_exercises),
            own_exercises.len()
        )
        .unwrap();
        for (file, todo) in own_exercises {
            writeln!(g, "- {todo} (`{file}`)").unwrap();
        }
    }
    let later: usize = written.later.iter().map(|(_, l)| l.len()).sum();
    if !written.later.is_empty() {
        writeln!(
            g,
            "\n## Later chapters: {later} more todo!s\n\nThey are not this chapter's work: go on \
             with them here once chapter {id} passes, chapter by chapter (each chapter's page \
             numbers its todo!s in order under \"Build it\").\n"
        )
        .unwrap();
        for (key, lessons) in &written.later {
            let c = course.chapter(*key);
            let todos = match lessons.len() {
                0 => "nothing to write".to_string(),
                n => format!("{n} todo!s"),
            };
            writeln!(
                g,
                "- chapter {} (`{}`, {}): {todos}",
                c.id, c.package, c.book
            )
            .unwrap();
        }
    }
    let others: Vec<String> = written
        .exercises
        .iter()
        .filter(|(k, _)| *k != phase)
        .map(|(k, e)| format!("{}: {}", label(*k), count_exercises(e)))
        .collect();
    if !others.is_empty() {
        writeln!(
            g,
            "\nThe exercises of the other chapters are stubs too (chapter: exercises; {}).",
            others.join(", ")
        )
        .unwrap();
    }
    writeln!(
        g,
        "\n## In this starter\n\n`.cargo/config.toml` turns off proptest's shrinking and its \
         regression files, and insta's `.snap.new` files: a test on a `todo!` fails once, \
         briefly, and writes nothing. A snapshot test that fails shows what differs from the \
         reference's output; change your code, never the `.snap` file. `README.md` says what \
         runs at this chapter."
    )
    .unwrap();
    g
}

/// Exercises (not todo!s: an exercise may have several) in a chapter's list.
fn count_exercises(todos: &[(String, String)]) -> usize {
    let mut numbers: Vec<Vec<usize>> = todos.iter().map(|(_, t)| exercise_number(t)).collect();
    numbers.dedup();
    numbers.len()
}

/// `README.md` of a starter: what runs at this chapter and what still stops on a `todo!`.
fn readme(course: &Course, phase: Key) -> Result<String, String> {
    let chapter = course.chapter(phase);
    let mut r = String::new();
    writeln!(
        r,
        "# nano-serving: the starter workspace of chapter {}\n\n\
         This workspace was written by `cargo xtask starter --phase {}` from nano-serving, an \
         LLM serving engine built as a course. [TUTORIAL.md](TUTORIAL.md) is the course's front \
         page and [book/](book/) its chapters; [STARTER.md](STARTER.md) lists the todo!s to \
         write here, in order.\n\n## What runs at chapter {}\n",
        chapter.id, chapter.id, chapter.id
    )
    .unwrap();
    let mut blocked_from: Option<String> = None;
    for (&key, c) in &course.chapters {
        let runs = describe_targets(course, &c.dir);
        let has_lessons = !course.lessons(c)?.is_empty();
        if key < phase {
            let state = if course.in_starter {
                "is as it was in the workspace this starter came from"
            } else {
                "is solved"
            };
            writeln!(
                r,
                "- Chapter {} (`{}`) {state}: `cargo test -p {}`{}.",
                c.id, c.package, c.package, runs
            )
            .unwrap();
        } else if key == phase {
            if has_lessons {
                writeln!(
                    r,
                    "- Chapter {} (`{}`) is yours: `cargo test -p {}` fails on its todo!s until \
                     you write them; then{}.",
                    c.id,
                    c.package,
                    c.package,
                    if runs.is_empty() {
                        " it passes".to_string()
                    } else {
                        runs.replacen(", ", " ", 1)
                    }
                )
                .unwrap();
                blocked_from.get_or_insert(c.id.clone());
            } else {
                writeln!(
                    r,
                    "- Chapter {} (`{}`) has nothing to write: `cargo test -p {}`{}.",
                    c.id, c.package, c.package, runs
                )
                .unwrap();
            }
        } else if has_lessons {
            blocked_from.get_or_insert(c.id.clone());
        }
    }
    let later: Vec<String> = course
        .chapters
        .range((phase.0, phase.1 + 1)..)
        .map(|(_, c)| format!("`{}` ({})", c.package, c.id))
        .collect();
    if !later.is_empty() {
        writeln!(
            r,
            "- The later chapters, {}, stop on a todo! (their own or one of a chapter they \
             build on) in their tests, examples and benchmarks until you write them.",
            later.join(", ")
        )
        .unwrap();
    }
    for (package, needs) in applications(course)? {
        let blocked = blocked_from
            .as_ref()
            .and_then(|b| crate::course::chapter_key(b))
            .is_some_and(|b| needs.iter().any(|&n| n >= b));
        let last = needs.iter().max().map(|&k| label(k)).unwrap_or_default();
        if blocked {
            writeln!(
                r,
                "- `{package}`, the command line built from part 6, needs every chapter up to \
                 {last}: `cargo run --release -p {package} -- generate \"ROMEO:\"` stops on a \
                 todo! until they are written."
            )
            .unwrap();
        } else {
            writeln!(
                r,
                "- `{package}` runs: `cargo run --release -p {package} -- generate \"ROMEO:\"`, \
                 `cargo run --release -p {package} -- --help`."
            )
            .unwrap();
        }
    }
    writeln!(
        r,
        "\n## Build time\n\n\
         The first build compiles the dependencies: about 2 minutes for chapter 1 and 4 to 5 \
         minutes from chapter 2 on, on 2 cores. Later builds take seconds. To pay it once for \
         every starter you write, give them one build folder: `export \
         CARGO_TARGET_DIR=$HOME/.cache/nano-serving-target` (each starter's version carries its \
         own stamp, so their crates never mix)."
    )
    .unwrap();
    Ok(r)
}

/// ", `cargo run -p P --example E`, `cargo bench -p P`" for a chapter's examples and benches.
fn describe_targets(course: &Course, dir: &str) -> String {
    let package = course
        .read(&format!("{dir}/Cargo.toml"))
        .ok()
        .and_then(|t| manifest_value(&t, "package", "name"))
        .unwrap_or_default();
    let mut parts = Vec::new();
    for file in &course.files {
        if let Some(name) = file
            .strip_prefix(&format!("{dir}/examples/"))
            .and_then(|f| f.strip_suffix(".rs"))
            .filter(|n| !n.contains('/'))
        {
            parts.push(format!(
                "`cargo run --release -p {package} --example {name}`"
            ));
        }
    }
    if course
        .files
        .iter()
        .any(|f| f.starts_with(&format!("{dir}/benches/")))
    {
        parts.push(format!("`cargo bench -p {package}`"));
    }
    parts.iter().map(|p| format!(", {p}")).collect()
}

/// The workspace's applications (a package with `src/main.rs`, other than xtask) and the
/// chapters each needs (its chapter dependencies that are not optional).
fn applications(course: &Course) -> Result<Vec<(String, Vec<Key>)>, String> {
    let mut apps = Vec::new();
    for file in &course.files {
        let Some(dir) = file.strip_suffix("/src/main.rs") else {
            continue;
        };
        if dir == "xtask" {
            continue;
        }
        let manifest = course.read(&format!("{dir}/Cargo.toml"))?;
        let package = manifest_value(&manifest, "package", "name").unwrap_or_default();
        let mut needs = Vec::new();
        let mut table = "";
        for line in manifest.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                table = name;
                continue;
            }
            if table != "dependencies" || line.contains("optional = true") {
                continue;
            }
            let name = line.split(['=', '.']).next().unwrap_or("").trim();
            if let Some((&key, _)) = course.chapters.iter().find(|(_, c)| c.package == name) {
                needs.push(key);
            }
        }
        apps.push((package, needs));
    }
    Ok(apps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_version_gets_the_stamp_once() {
        let manifest = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[package]\nversion = \"9.9.9\"\n";
        let once = stamp_version(manifest, "1.t5").unwrap();
        assert!(once.contains("[workspace.package]\nversion = \"0.1.0+starter.1.t5\"\n"));
        assert!(once.contains("[package]\nversion = \"9.9.9\""));
        let twice = stamp_version(&once, "2.t6").unwrap();
        assert!(
            twice.contains("version = \"0.1.0+starter.2.t6\"\n"),
            "{twice}"
        );
    }
}
