//! `cargo xtask`: project tasks that are not part of the engine.
//!
//! `cargo xtask starter --phase N --out DIR` writes the student workspace for chapter N (`3`,
//! or `6.2` for a chapter of part 6): a copy of this repository in which every chapter from N
//! on has its solution regions replaced by `todo!("chapter N.k: ...")`, keeping every
//! signature and every test, so the reference tests become the student's harness. A chapter is
//! a crate whose Cargo.toml says `[package.metadata.course] chapter = "N"`. `--check` proves, in a temporary directory, that the
//! starter builds and that its chapter tests fail only with those todo messages.
//! Exercise files (`src/exercises/` of a chapter crate) lose their reference answers in every starter,
//! whatever the chapter: only their `todo!("exercise N.k: ...")` stubs are handed out.
//! `cargo xtask regions` lists every solution region and exercise (the teacher's map of the
//! course).

mod exercise_stubs;
mod solution_regions;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use exercise_stubs::strip_solutions;
use solution_regions::{Region, replace_regions};

const USAGE: &str = "usage:
  cargo xtask starter --phase N --out DIR    write the starter workspace for chapter N (3, 6.2, ...)
  cargo xtask starter --check [--phase N]    check the starter of chapter N (default: every chapter)
  cargo xtask regions                        list every solution region and exercise";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let root = repo_root();
    match args.first().map(String::as_str) {
        Some("starter") => {
            let mut phase = None;
            let mut out = None;
            let mut check = false;
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--phase" => {
                        let v = it.next().ok_or("--phase needs a chapter number")?;
                        phase = Some(chapter_key(v).ok_or(format!("bad chapter {v:?}"))?);
                    }
                    "--out" => {
                        out = Some(PathBuf::from(it.next().ok_or("--out needs a directory")?))
                    }
                    "--check" => check = true,
                    other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
                }
            }
            let phases = phase_dirs(&root)?;
            if let Some(p) = phase
                && !phases.contains_key(&p)
            {
                let all: Vec<&str> = phases.values().map(|c| c.id.as_str()).collect();
                return Err(format!("no chapter {}: chapters are {all:?}", label(p)));
            }
            if check {
                let chapters: Vec<Key> = match phase {
                    Some(p) => vec![p],
                    None => phases.keys().copied().collect(),
                };
                for p in chapters {
                    check_starter(&root, p)?;
                }
                Ok(())
            } else {
                let phase = phase.ok_or(format!("--phase is required\n{USAGE}"))?;
                let out = out.ok_or(format!("--out is required\n{USAGE}"))?;
                // A starter overwrites files: never write one over a student's work.
                if fs::read_dir(&out).is_ok_and(|mut entries| entries.next().is_some()) {
                    return Err(format!(
                        "{} is not empty: write the starter into a new directory",
                        out.display()
                    ));
                }
                let regions = write_starter(&root, phase, &out)?;
                let chapter = &phases[&phase];
                let exercises = exercises_of(&root, &chapter.dir)?;
                println!(
                    "wrote the chapter {} starter to {} ({} todo!s to write, {} exercise todo!s)",
                    chapter.id,
                    out.display(),
                    regions.len(),
                    exercises.len()
                );
                println!(
                    "next: cd {} && cargo test -p {}",
                    out.display(),
                    chapter.package
                );
                Ok(())
            }
        }
        Some("regions") => {
            for chapter in phase_dirs(&root)?.values() {
                let dir = &chapter.dir;
                for (file, region) in regions_of(&root, dir, &chapter.id)? {
                    println!(
                        "{}  {}  {}  {}",
                        region.section, file, region.function, region.hint
                    );
                }
                for (file, todo) in exercises_of(&root, dir)? {
                    println!("{todo}  ({file})");
                }
            }
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_path_buf()
}

/// A chapter's number as a sortable key: `3` is (3, 0), `6.2` is (6, 2).
type Key = (usize, usize);

fn chapter_key(id: &str) -> Option<Key> {
    match id.split_once('.') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok().filter(|&m| m > 0)?)),
        None => Some((id.parse().ok()?, 0)),
    }
}

fn label(key: Key) -> String {
    match key {
        (major, 0) => major.to_string(),
        (major, minor) => format!("{major}.{minor}"),
    }
}

/// A chapter crate: its number as written, its folder and its package.
#[derive(Debug, Clone)]
struct Chapter {
    id: String,
    dir: String,
    package: String,
}

/// Every chapter crate (`phaseN-name/` or a crate one folder below it) by chapter number,
/// read from `[package.metadata.course] chapter = "N"` in its Cargo.toml.
fn phase_dirs(root: &Path) -> Result<BTreeMap<Key, Chapter>, String> {
    let mut chapters = BTreeMap::new();
    for file in repo_files(root)? {
        let parts: Vec<&str> = file.split('/').collect();
        let in_phase = parts[0].starts_with("phase") && matches!(parts.len(), 2 | 3);
        if !in_phase || parts.last() != Some(&"Cargo.toml") {
            continue;
        }
        let text = fs::read_to_string(root.join(&file)).map_err(|e| format!("{file}: {e}"))?;
        let Some(id) = manifest_value(&text, "package.metadata.course", "chapter") else {
            continue;
        };
        let package = manifest_value(&text, "package", "name")
            .ok_or_else(|| format!("{file}: no package name"))?;
        let key = chapter_key(&id).ok_or_else(|| format!("{file}: bad chapter {id:?}"))?;
        let dir = file.trim_end_matches("/Cargo.toml").to_string();
        if let Some(other) = chapters.insert(key, Chapter { id, dir, package }) {
            return Err(format!(
                "{file}: chapter {} is also {}",
                label(key),
                other.dir
            ));
        }
    }
    Ok(chapters)
}

/// The string value of `key` in the `[table]` of a Cargo.toml.
fn manifest_value(text: &str, table: &str, key: &str) -> Option<String> {
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

/// Files of the repository as git sees them (tracked, and new files not ignored).
fn repo_files(root: &Path) -> Result<Vec<String>, String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git ls-files failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|f| !f.is_empty() && root.join(f).is_file())
        .map(str::to_string)
        .collect())
}

/// The Rust sources of one chapter, sorted, so region numbers are stable; its exercises
/// are apart (they are numbered by hand and never part of the chapter's harness).
fn chapter_sources(root: &Path, dir: &str) -> Result<Vec<String>, String> {
    let exercises = format!("{dir}/src/exercises/");
    let mut files: Vec<String> = repo_files(root)?
        .into_iter()
        .filter(|f| f.starts_with(&format!("{dir}/src/")) && f.ends_with(".rs"))
        .filter(|f| !f.starts_with(&exercises))
        .collect();
    files.sort();
    Ok(files)
}

/// The exercise files of one chapter, sorted.
fn exercise_sources(root: &Path, dir: &str) -> Result<Vec<String>, String> {
    let exercises = format!("{dir}/src/exercises/");
    let mut files: Vec<String> = repo_files(root)?
        .into_iter()
        .filter(|f| f.starts_with(&exercises) && f.ends_with(".rs"))
        .collect();
    files.sort();
    Ok(files)
}

/// Each exercise `todo!` message of a chapter, with its file.
fn exercises_of(root: &Path, dir: &str) -> Result<Vec<(String, String)>, String> {
    let mut all = Vec::new();
    for file in exercise_sources(root, dir)? {
        let text = fs::read_to_string(root.join(&file)).map_err(|e| format!("{file}: {e}"))?;
        let (_, todos) = strip_solutions(&text).map_err(|e| format!("{file}: {e}"))?;
        all.extend(todos.into_iter().map(|t| (file.clone(), t)));
    }
    all.sort_by_key(|(_, todo)| exercise_number(todo));
    Ok(all)
}

/// `exercise 4.2: ...` -> [4, 2] and `exercise 6.3.1: ...` -> [6, 3, 1], for listing exercises
/// in the tutorial's order.
fn exercise_number(todo: &str) -> Vec<usize> {
    let number = todo
        .strip_prefix("exercise ")
        .and_then(|t| t.split(':').next())
        .unwrap_or("");
    number
        .split('.')
        .map(|n| n.parse().unwrap_or(usize::MAX))
        .collect()
}

fn regions_of(root: &Path, dir: &str, chapter: &str) -> Result<Vec<(String, Region)>, String> {
    let mut all = Vec::new();
    for file in chapter_sources(root, dir)? {
        let text = fs::read_to_string(root.join(&file)).map_err(|e| format!("{file}: {e}"))?;
        let (_, regions) =
            replace_regions(&text, chapter, all.len() + 1).map_err(|e| format!("{file}: {e}"))?;
        all.extend(regions.into_iter().map(|r| (file.clone(), r)));
    }
    Ok(all)
}

/// Copies the repository to `out` with the solution regions of chapters >= `phase` replaced
/// and the reference answers of every chapter's exercises cut.
fn write_starter(root: &Path, phase: Key, out: &Path) -> Result<Vec<Region>, String> {
    let phases = phase_dirs(root)?;
    let mut replaced: BTreeMap<String, String> = BTreeMap::new();
    let mut listing = Vec::new();
    let mut exercises = Vec::new();
    for chapter in phases.values() {
        for file in exercise_sources(root, &chapter.dir)? {
            let text = fs::read_to_string(root.join(&file)).map_err(|e| format!("{file}: {e}"))?;
            let (new, todos) = strip_solutions(&text).map_err(|e| format!("{file}: {e}"))?;
            replaced.insert(file.clone(), new);
            exercises.extend(todos.into_iter().map(|t| (file.clone(), t)));
        }
    }
    exercises.sort_by_key(|(_, todo)| exercise_number(todo));
    for chapter in phases.range(phase..).map(|(_, c)| c) {
        let mut index = 1;
        for file in chapter_sources(root, &chapter.dir)? {
            let text = fs::read_to_string(root.join(&file)).map_err(|e| format!("{file}: {e}"))?;
            let (new, regions) =
                replace_regions(&text, &chapter.id, index).map_err(|e| format!("{file}: {e}"))?;
            index += regions.len();
            if !regions.is_empty() {
                replaced.insert(file.clone(), new);
                listing.extend(regions.into_iter().map(|r| (file.clone(), r)));
            }
        }
    }
    for file in repo_files(root)? {
        let dst = out.join(&file);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        match replaced.get(&file) {
            Some(text) => fs::write(&dst, text),
            None => fs::copy(root.join(&file), &dst).map(|_| ()),
        }
        .map_err(|e| format!("{}: {e}", dst.display()))?;
    }
    let chapter = &phases[&phase];
    let mut guide = format!(
        "# Starter workspace: chapter {}\n\nEvery `todo!` below is yours to write; `cargo test -p {}` tells you which are left.\n\n",
        chapter.id, chapter.package
    );
    for (file, r) in &listing {
        guide.push_str(&format!(
            "- {}: `{}` in `{file}`. {}\n",
            r.section, r.function, r.hint
        ));
    }
    if !exercises.is_empty() {
        guide.push_str(
            "\n## Exercises\n\nOnce a chapter's tests pass: `cargo test -p <its package> --features exercises --test exercises`.\n\n",
        );
        for (file, todo) in &exercises {
            guide.push_str(&format!("- {todo} (`{file}`)\n"));
        }
    }
    fs::write(out.join("STARTER.md"), guide).map_err(|e| e.to_string())?;
    Ok(listing.into_iter().map(|(_, r)| r).collect())
}

/// Writes the chapter's starter to a temporary directory, builds it, and runs the chapter's
/// tests: they must fail, and only with that chapter's todo messages. Then its exercise tests,
/// which may fail only on an exercise todo (or on the chapter's own, which they build on), and
/// no exercise file may still hold an answer.
fn check_starter(root: &Path, phase: Key) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!(
        "nano-serving-starter-{}-{}",
        label(phase),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    let regions = write_starter(root, phase, &dir)?;
    let result = check_written_starter(root, phase, &dir, &regions);
    let _ = fs::remove_dir_all(&dir);
    result
}

fn check_written_starter(
    root: &Path,
    key: Key,
    dir: &Path,
    regions: &[Region],
) -> Result<(), String> {
    let phases = phase_dirs(root)?;
    let chapter = &phases[&key];
    let phase = &chapter.id;
    no_answers_left(dir)?;
    // A build directory of its own, shared by every chapter's starter so the dependencies
    // are compiled once. Not the repository's: cargo names a workspace crate's artifacts by
    // its path inside the workspace, so a starter's `phase0` would replace the reference
    // `phase0` there and look up to date to the next build of the repository.
    let target = root.join("target").join("starter");
    let cargo = |args: &[&str]| {
        Command::new(env!("CARGO"))
            .args(args)
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", &target)
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
    let own = regions
        .iter()
        .filter(|r| r.section.starts_with(&format!("chapter {phase}.")))
        .count();
    if own == 0 {
        println!("chapter {phase}: no solution regions of its own, nothing to check");
    } else {
        let tested = cargo(&[
            "test",
            "-p",
            &package,
            "--no-fail-fast",
            "--",
            "--test-threads=1",
        ])?;
        let failures = only_todo_failures(&tested, &[&chapter_todo])
            .map_err(|e| format!("chapter {phase} starter: {e}"))?;
        println!(
            "chapter {phase}: starter builds; {failures} tests fail, each on one of its {own} todo!s"
        );
    }
    let exercises = exercises_of(root, &chapter.dir)?;
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
    Ok(())
}

/// Checks a test run that must fail, and only on todos with one of `expected` messages.
/// Returns how many tests failed.
fn only_todo_failures(tested: &std::process::Output, expected: &[&str]) -> Result<usize, String> {
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
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder).map_err(|e| format!("{}: {e}", folder.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
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
