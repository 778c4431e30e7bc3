//! `cargo xtask`: project tasks that are not part of the engine.
//!
//! `cargo xtask starter --phase N --out DIR` writes the student workspace for chapter N (`3`,
//! or `6.2` for a chapter of part 6): a copy of this repository's files in which every chapter
//! from N on has its lessons replaced by `todo!("chapter N.k: ...")`, numbered as the
//! chapter's book page numbers them, keeping every signature and every test, so the reference
//! tests become the student's harness. Exercise files (`src/exercises/` of a chapter crate)
//! lose their reference answers in every starter, whatever the chapter. It runs in a starter
//! too: there the files are those the starter was written with. `--check` proves, in a
//! temporary directory, that a starter builds and that its chapter tests fail only with its
//! todo messages, briefly. `cargo xtask regions` lists every lesson and exercise (the
//! teacher's map of the course); `cargo xtask book` checks every command of the book.

mod book;
mod check;
mod course;
mod exercise_stubs;
mod solution_regions;
mod starter;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use course::{Course, Key, chapter_key, label};

const USAGE: &str = "usage:
  cargo xtask starter --phase N --out DIR    write the starter workspace for chapter N (3, 6.2, ...)
  cargo xtask starter --check [--phase N]    check the starter of chapter N (default: every chapter)
  cargo xtask regions                        list every lesson and exercise, chapter by chapter
  cargo xtask book [--static]                check every command of the book (--static: run none)";

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
    let course = Course::open(&workspace_root())?;
    match args.first().map(String::as_str) {
        Some("starter") => starter_command(&course, &args[1..]),
        Some("regions") => {
            for chapter in course.chapters.values() {
                for lesson in course.lessons(chapter)? {
                    println!(
                        "{}  {}  {}  {}",
                        lesson.section, lesson.file, lesson.region.function, lesson.region.hint
                    );
                }
                for (file, todo) in course.exercises(chapter)? {
                    println!("{todo}  ({file})");
                }
            }
            Ok(())
        }
        Some("book") => match &args[1..] {
            [] => book::check_book(&course, true),
            [flag] if flag == "--static" => book::check_book(&course, false),
            _ => Err(USAGE.into()),
        },
        _ => Err(USAGE.into()),
    }
}

fn starter_command(course: &Course, args: &[String]) -> Result<(), String> {
    let mut phase = None;
    let mut out = None;
    let mut check = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--phase" => {
                let v = it.next().ok_or("--phase needs a chapter number")?;
                phase = Some(chapter_key(v).ok_or(format!("bad chapter {v:?}"))?);
            }
            "--out" => out = Some(PathBuf::from(it.next().ok_or("--out needs a directory")?)),
            "--check" => check = true,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if let Some(p) = phase
        && !course.chapters.contains_key(&p)
    {
        let all: Vec<&str> = course.chapters.values().map(|c| c.id.as_str()).collect();
        return Err(format!("no chapter {}: chapters are {all:?}", label(p)));
    }
    if check {
        let chapters: Vec<Key> = match phase {
            Some(p) => vec![p],
            None => course.chapters.keys().copied().collect(),
        };
        for p in chapters {
            check::check_starter(course, p)?;
        }
        return Ok(());
    }
    let phase = phase.ok_or(format!("--phase is required\n{USAGE}"))?;
    let out = out.ok_or(format!("--out is required\n{USAGE}"))?;
    // A starter overwrites files: never write one over a student's work.
    if fs::read_dir(&out).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(format!(
            "{} is not empty: write the starter into a new directory",
            out.display()
        ));
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let stamp = format!("{}.t{nanos}", label(phase).replace('.', "-"));
    let written = starter::write_starter(course, phase, &out, &stamp)?;
    let chapter = course.chapter(phase);
    let exercises: usize = written
        .exercises
        .iter()
        .filter(|(k, _)| *k == phase)
        .map(|(_, e)| e.len())
        .sum();
    let later: usize = written.later.iter().map(|(_, l)| l.len()).sum();
    let start = match written.own.first() {
        Some(first) => format!(
            " (start with {}, in {}'s Build it)",
            first.number, chapter.book
        ),
        None => String::new(),
    };
    println!(
        "wrote the chapter {} starter to {}: chapter {} has {} todo!s{start} and {exercises} \
         exercise todo!s; later chapters hold {later} more (STARTER.md lists them)",
        chapter.id,
        out.display(),
        chapter.id,
        written.own.len(),
    );
    println!(
        "next: cd {} && cargo test -p {}",
        out.display(),
        chapter.package
    );
    Ok(())
}

/// The workspace this xtask was built in: the repository, or a starter written from it.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}
