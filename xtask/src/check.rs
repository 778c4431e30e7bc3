//! `cargo xtask starter --check`: a chapter's starter, written to a temporary folder, builds;
//! the chapter's tests fail only on its own `todo!`s, briefly and without writing a file into
//! the student's tree; its exercise tests fail only on `todo!`s; no exercise answer is left.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::course::{Course, Key, label};
use crate::starter::write_starter;

/// The most lines a chapter's first test run in its starter may print (from cargo's first
/// `Running` line on): enough for one short failure per test, not for a wall of repeats.
const MAX_TEST_LINES: usize = 1_000;

/// Writes the chapter's starter to a temporary directory and checks it.
pub fn check_starter(course: &Course, phase: Key) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!(
        "nano-serving-starter-{}-{}",
        label(phase),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    // One stamp for every check: each starter checked is freshly written, so its crates are
    // newer than any build of another one in the shared build folder.
    let result = write_starter(course, phase, &dir, "check")
        .and_then(|written| check_written_starter(course, phase, &dir, written.own.len()));
    let _ = fs::remove_dir_all(&dir);
    result
}

fn check_written_starter(course: &Course, key: Key, dir: &Path, own: usize) -> Result<(), String> {
    let chapter = course.chapter(key);
    let phase = &chapter.id;
    no_answers_left(dir)?;
    // A build directory of its own, shared by every chapter's starter so the dependencies
    // are compiled once. Not the repository's: a starter's crates have the same names and
    // paths as the reference's, and would replace them there.
    let target = course.root.join("target").join("starter");
    let cargo = |args: &[&str]| {
        Command::new(env!("CARGO"))
            .args(args)
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", &target)
            // What a student sees by default.
            .env_remove("RUST_BACKTRACE")
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))
    };
    let built = cargo(&["check", "--workspace", "--all-targets", "--quiet"])?;
    if !built.status.success() {
        return Err(format!(
            "chapter {phase} starter does not build:\n{}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let package = chapter.package.clone();
    let chapter_todo = format!("not yet implemented: chapter {phase}.");
    let before = files_under(dir)?;
    if own == 0 {
        println!("chapter {phase}: no solution regions of its own, nothing to check");
    } else {
        // One test at a time, so each failure's section can be read apart; the output is
        // what a first run prints in any order.
        let tested = cargo(&[
            "test",
            "-p",
            &package,
            "--no-fail-fast",
            "--",
            "--test-threads=1",
        ])?;
        let lines = test_run_lines(&tested);
        if lines > MAX_TEST_LINES {
            return Err(format!(
                "chapter {phase} starter: its first test run prints {lines} lines (at most \
                 {MAX_TEST_LINES}): a todo! must fail once, briefly"
            ));
        }
        let failures = only_todo_failures(&tested, &[&chapter_todo])
            .map_err(|e| format!("chapter {phase} starter: {e}"))?;
        println!(
            "chapter {phase}: starter builds; {failures} tests fail, each on one of its {own} \
             todo!s; the test run prints {lines} lines"
        );
    }
    let exercises = course.exercises(chapter)?;
    if !exercises.is_empty() {
        let tested = cargo(&[
            "test",
            "-p",
            &package,
            "--features",
            "exercises",
            "--test",
            "exercises",
            "--no-fail-fast",
            "--",
            "--test-threads=1",
        ])?;
        let exercise_todo = format!("not yet implemented: exercise {phase}.");
        let failures = only_todo_failures(&tested, &[&exercise_todo, &chapter_todo])
            .map_err(|e| format!("chapter {phase} starter, exercises: {e}"))?;
        println!(
            "chapter {phase}: {failures} exercise tests fail, each on a todo!; {} exercise todo!s",
            exercises.len()
        );
    }
    let after = files_under(dir)?;
    if let Some(new) = after.difference(&before).next() {
        return Err(format!(
            "chapter {phase} starter: its tests wrote {} into the student's tree",
            new.display()
        ));
    }
    Ok(())
}

/// Lines of a cargo test log from its first `Running` line on (the build before is apart).
fn test_run_lines(tested: &Output) -> usize {
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&tested.stderr),
        String::from_utf8_lossy(&tested.stdout)
    );
    let build: usize = log
        .lines()
        .take_while(|l| !l.trim_start().starts_with("Running"))
        .count();
    log.lines().count() - build
}

/// Every file under `dir` (its build folder is elsewhere).
fn files_under(dir: &Path) -> Result<BTreeSet<PathBuf>, String> {
    let mut files = BTreeSet::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder).map_err(|e| format!("{}: {e}", folder.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                folders.push(path);
            } else {
                files.insert(path);
            }
        }
    }
    Ok(files)
}

/// Checks a test run that must fail, and only on todos with one of `expected` messages.
/// Returns how many tests failed.
fn only_todo_failures(tested: &Output, expected: &[&str]) -> Result<usize, String> {
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&tested.stdout),
        String::from_utf8_lossy(&tested.stderr)
    );
    let failures = failure_sections(&log);
    if tested.status.success() || failures.is_empty() {
        if log.contains("error[") || log.contains("could not compile") {
            return Err(format!("the tests do not build:\n{log}"));
        }
        return Err("its tests pass, but todo!s are left".into());
    }
    let wrong = failures
        .iter()
        .find(|(_, body)| !expected.iter().any(|e| body.contains(e)));
    if let Some((name, body)) = wrong {
        return Err(format!(
            "test {name} fails for another reason than a todo ({}):\n{body}",
            expected.join(" or ")
        ));
    }
    Ok(failures.len())
}

/// No exercise file of a written starter may hold a reference answer or its feature switch.
fn no_answers_left(dir: &Path) -> Result<(), String> {
    for path in files_under(dir)? {
        let in_exercises = path.parent().is_some_and(|p| p.ends_with("src/exercises"));
        if !in_exercises || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for leak in ["BEGIN SOLUTION", "feature = \"solutions\""] {
            if text.contains(leak) {
                return Err(format!(
                    "starter file {} still holds {leak:?}",
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

/// The `---- name stdout ----` sections of a cargo test log, by test name.
fn failure_sections(log: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in log.lines() {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        {
            out.push((name.to_string(), String::new()));
        } else if line == "failures:" || line.starts_with("test result:") {
            if let Some(last) = out.last_mut() {
                last.1.push('\u{0}');
            }
        } else if let Some(last) = out.last_mut()
            && !last.1.ends_with('\u{0}')
        {
            last.1.push_str(line);
            last.1.push('\n');
        }
    }
    out
}
