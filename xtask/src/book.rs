//! `cargo xtask book`: every command the course shows a student (the `sh` blocks and the
//! inline `cargo ...` of `book/` and `TUTORIAL.md`) is checked, so the book cannot drift from
//! the code.
//!
//! Each command is checked against the workspace (its package, features, test target and
//! test filter, example, bench, chapter, subcommand and flags, HTTP route) and then run, or
//! left to the step of CI that runs it:
//!
//! - `cargo test ...` runs in CI's `cargo test --workspace`, or its exercise step (whose
//!   package list must name the package);
//! - `cargo run --example` runs here, in the test profile's build that `cargo test
//!   --workspace` already made (the book's `--release` only makes it faster), and so do
//!   `nanoserve generate`, `chat` (fed the book's `> ` lines) and `serve` with the page's
//!   `curl` commands;
//! - `nanoserve bench` and `report` take minutes and `--device cuda` needs a GPU: their
//!   command lines are parsed (`--help` appended: a bad flag or value is an error), and so are
//!   those of examples built with a `cuda` feature;
//! - `cargo bench` compiles and runs every benchmark once (`cargo test --benches`); the GPU
//!   kernels' benchmarks are compiled only;
//! - `cargo xtask starter` runs in CI's `cargo xtask starter --check`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::course::{Course, chapter_key, manifest_value};

/// No command of the book may run longer than this here.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The subcommands of `nanoserve` that are quick on the embedded model; the others are parsed.
const RUNNABLE: [&str; 3] = ["generate", "chat", "serve"];

/// One command of a page: its text, the input lines typed into it (`> ...`), where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct BookCommand {
    pub page: String,
    pub line: usize,
    pub text: String,
    pub input: Vec<String>,
}

pub fn check_book(course: &Course, run: bool) -> Result<(), String> {
    let workspace = Workspace::read(course)?;
    let mut pages: Vec<&String> = course
        .files
        .iter()
        .filter(|f| (f.starts_with("book/") && f.ends_with(".md")) || *f == "TUTORIAL.md")
        .collect();
    pages.sort();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut seen: BTreeMap<(String, Vec<String>), String> = BTreeMap::new();
    for page in pages {
        let commands = commands(page, &course.read(page)?);
        let mut server: Option<Server> = None;
        for cmd in &commands {
            let at = format!("{}:{}: `{}`", cmd.page, cmd.line, cmd.text);
            // A command the book repeats is checked once; a curl needs the page's server.
            let key = (cmd.text.clone(), cmd.input.clone());
            if !cmd.text.starts_with("curl ")
                && let Some(first) = seen.get(&key)
            {
                *counts.entry("repeated").or_default() += 1;
                println!("{at}\n    the same command as {first}");
                continue;
            }
            seen.insert(key, format!("{}:{}", cmd.page, cmd.line));
            let started = Instant::now();
            match check_command(&workspace, cmd, run, &mut server) {
                Ok(how) => {
                    *counts.entry(how.kind()).or_default() += 1;
                    println!(
                        "{at}\n    {} ({:.1} s)",
                        how.describe(),
                        started.elapsed().as_secs_f64()
                    );
                }
                Err(e) => {
                    println!("{at}\n    FAILED: {e}");
                    failures.push(format!("{at}: {e}"));
                }
            }
        }
        drop(server);
    }
    let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!("book: {}", summary.join(", "));
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} commands of the book fail:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

/// How a command was checked.
enum Checked {
    Ran,
    Built(String),
    Parsed,
    InCi(String),
    Static(String),
}

impl Checked {
    fn kind(&self) -> &'static str {
        match self {
            Checked::Ran => "run here",
            Checked::Built(_) => "built here",
            Checked::Parsed => "parsed here",
            Checked::InCi(_) => "run by another step of CI",
            Checked::Static(_) => "checked against the workspace only",
        }
    }

    fn describe(&self) -> String {
        match self {
            Checked::Ran => "ran".into(),
            Checked::Built(why) => format!("built; not run: {why}"),
            Checked::Parsed => "its command line parses".into(),
            Checked::InCi(step) => format!("checked; CI runs it in {step}"),
            Checked::Static(why) => format!("checked against the workspace; not run: {why}"),
        }
    }
}

/// The commands of a Markdown page: every line of its `sh` blocks (a `\` continues a line, a
/// `# ` starts a comment, `> text` is input typed into the command before it) and every inline
/// code span that starts with `cargo `.
pub fn commands(page: &str, text: &str) -> Vec<BookCommand> {
    let mut out: Vec<BookCommand> = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending: Option<(usize, String)> = None;
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        if let Some(info) = line.trim_start().strip_prefix("```") {
            if fence.is_some() {
                fence = None;
            } else {
                inline_commands(page, &paragraph, &mut out);
                paragraph.clear();
                fence = Some(info.trim().to_string());
            }
            continue;
        }
        match fence.as_deref() {
            Some("sh") => {
                let body = strip_comment(line.trim());
                if let Some(input) = body.strip_prefix("> ") {
                    if let Some(last) = out.last_mut() {
                        last.input.push(input.to_string());
                    }
                    continue;
                }
                let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
                match body.strip_suffix('\\') {
                    Some(head) => {
                        joined.push_str(head.trim_end());
                        joined.push(' ');
                        pending = Some((start, joined));
                    }
                    None => {
                        joined.push_str(body);
                        let joined = joined.trim().to_string();
                        if !joined.is_empty() {
                            out.push(BookCommand {
                                page: page.to_string(),
                                line: start,
                                text: joined,
                                input: Vec::new(),
                            });
                        }
                    }
                }
            }
            Some(_) => {}
            None if line.trim().is_empty() => {
                inline_commands(page, &paragraph, &mut out);
                paragraph.clear();
            }
            None => paragraph.push((n, line)),
        }
    }
    inline_commands(page, &paragraph, &mut out);
    out
}

/// The inline `cargo ...` code spans of a paragraph (a span may wrap onto the next line).
fn inline_commands(page: &str, paragraph: &[(usize, &str)], out: &mut Vec<BookCommand>) {
    let Some(&(first, _)) = paragraph.first() else {
        return;
    };
    let mut text = String::new();
    let mut line_of = Vec::new();
    for (n, line) in paragraph {
        for _ in 0..=line.len() {
            line_of.push(*n);
        }
        text.push_str(line);
        text.push(' ');
    }
    let mut offset = 0;
    for (k, span) in text.split('`').enumerate() {
        if k % 2 == 1 && span.starts_with("cargo ") {
            let span: String = span.split_whitespace().collect::<Vec<_>>().join(" ");
            out.push(BookCommand {
                page: page.to_string(),
                line: line_of.get(offset).copied().unwrap_or(first),
                text: span,
                input: Vec::new(),
            });
        }
        offset += span.len() + 1;
    }
}

/// A line without its trailing `# comment` (a `#` after a space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (None, b'\'' | b'"') => quote = Some(b),
            (Some(q), _) if b == q => quote = None,
            (None, b'#') if i == 0 || bytes[i - 1] == b' ' => return line[..i].trim_end(),
            _ => {}
        }
    }
    line
}

/// The words of a command as a shell splits them (quotes, no expansion).
pub fn words(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("an unclosed quote".into());
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// A package of the workspace: its folder and manifest.
struct Package {
    dir: String,
    manifest: String,
}

/// What the checks look things up in.
struct Workspace<'a> {
    course: &'a Course,
    packages: BTreeMap<String, Package>,
    ci: String,
}

impl<'a> Workspace<'a> {
    fn read(course: &'a Course) -> Result<Self, String> {
        let mut packages = BTreeMap::new();
        for file in &course.files {
            let Some(dir) = file.strip_suffix("/Cargo.toml") else {
                continue;
            };
            let manifest = course.read(file)?;
            if let Some(name) = manifest_value(&manifest, "package", "name") {
                packages.insert(
                    name,
                    Package {
                        dir: dir.to_string(),
                        manifest,
                    },
                );
            }
        }
        let ci = course.read(".ci/run")?;
        Ok(Workspace {
            course,
            packages,
            ci,
        })
    }

    fn package(&self, name: &str) -> Result<&Package, String> {
        self.packages
            .get(name)
            .ok_or_else(|| format!("no package {name:?} in the workspace"))
    }

    fn has_file(&self, path: &str) -> bool {
        self.course.files.iter().any(|f| f == path)
    }

    /// Source files of a package under `sub` (`tests/exercises`, `src`, ...).
    fn sources_under(&self, package: &Package, sub: &str) -> Vec<&String> {
        let file = format!("{}/{sub}.rs", package.dir);
        let folder = format!("{}/{sub}/", package.dir);
        self.course
            .files
            .iter()
            .filter(|f| **f == file || (f.starts_with(&folder) && f.ends_with(".rs")))
            .collect()
    }

    fn check_features(
        &self,
        name: &str,
        package: &Package,
        features: &[String],
    ) -> Result<(), String> {
        for feature in features {
            let declared = package
                .manifest
                .lines()
                .skip_while(|l| l.trim() != "[features]")
                .skip(1)
                .take_while(|l| !l.trim_start().starts_with('['))
                .any(|l| l.split('=').next().is_some_and(|k| k.trim() == feature));
            if !declared {
                return Err(format!("package {name} has no feature {feature:?}"));
            }
        }
        Ok(())
    }
}

/// A parsed `cargo` command line: `-p`, `--features`, target flags, free words, and what
/// follows `--`.
#[derive(Default, Debug)]
struct CargoArgs {
    package: Option<String>,
    features: Vec<String>,
    test: Option<String>,
    example: Option<String>,
    bench: Option<String>,
    free: Vec<String>,
    after: Vec<String>,
}

fn cargo_args(words: &[String]) -> Result<CargoArgs, String> {
    let mut a = CargoArgs::default();
    let mut it = words.iter();
    while let Some(w) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match w.as_str() {
            "-p" | "--package" => a.package = Some(value(w)?),
            "--features" => a
                .features
                .extend(value(w)?.split(',').map(|f| f.trim().to_string())),
            "--test" => a.test = Some(value(w)?),
            "--example" => a.example = Some(value(w)?),
            "--bench" => a.bench = Some(value(w)?),
            "--release" | "--quiet" | "-q" => {}
            "--" => {
                a.after = it.cloned().collect();
                break;
            }
            other if other.starts_with('-') => {
                return Err(format!("the book's checker does not know the flag {other}"));
            }
            other => a.free.push(other.to_string()),
        }
    }
    Ok(a)
}

fn check_command(
    ws: &Workspace,
    cmd: &BookCommand,
    run: bool,
    server: &mut Option<Server>,
) -> Result<Checked, String> {
    let words = words(&cmd.text)?;
    let Some((program, rest)) = words.split_first() else {
        return Err("an empty command".into());
    };
    match (program.as_str(), rest.first().map(String::as_str)) {
        ("cargo", Some("test")) => check_test(ws, &rest[1..]),
        ("cargo", Some("bench")) => check_bench(ws, &rest[1..], run),
        ("cargo", Some("build")) => check_build(ws, &rest[1..]),
        ("cargo", Some("run")) => {
            let a = cargo_args(&rest[1..])?;
            let name = a.package.clone().ok_or("`cargo run` without -p")?;
            let package = ws.package(&name)?;
            ws.check_features(&name, package, &a.features)?;
            match &a.example {
                Some(example) => {
                    let file = format!("{}/examples/{example}.rs", package.dir);
                    if !ws.has_file(&file) {
                        return Err(format!("no example {example} ({file})"));
                    }
                    let features = a.features.join(",");
                    let mut args = vec![
                        "run",
                        "--quiet",
                        "--profile",
                        "test",
                        "-p",
                        &name,
                        "--example",
                        example,
                    ];
                    if !features.is_empty() {
                        args.extend(["--features", &features]);
                    }
                    args.push("--");
                    args.extend(a.after.iter().map(String::as_str));
                    let on_gpu = a.features.iter().any(|f| f.ends_with("cuda"));
                    if run && on_gpu {
                        args.push("--help");
                        run_cargo(ws, &args, &[])?;
                        Ok(Checked::Parsed)
                    } else if run {
                        run_cargo(ws, &args, &[])?;
                        Ok(Checked::Ran)
                    } else {
                        Ok(Checked::Static("--static".into()))
                    }
                }
                None => check_nanoserve(ws, &name, &a.after, &cmd.input, run, server),
            }
        }
        ("target/release/nanoserve", _) => {
            check_nanoserve(ws, "nanoserve", rest, &cmd.input, run, server)
        }
        ("cargo", Some("xtask")) => check_xtask(ws, &rest[1..]),
        ("cd", _) => Ok(Checked::Static("a change of folder".into())),
        ("curl", _) => check_curl(ws, rest, run, server),
        _ => Err("the book's checker does not know this command: teach xtask/src/book.rs".into()),
    }
}

fn check_test(ws: &Workspace, words: &[String]) -> Result<Checked, String> {
    let a = cargo_args(words)?;
    let name = a.package.clone().ok_or("`cargo test` without -p")?;
    let package = ws.package(&name)?;
    ws.check_features(&name, package, &a.features)?;
    let sources = match &a.test {
        Some(test) => {
            let sources = ws.sources_under(package, &format!("tests/{test}"));
            if sources.is_empty() {
                return Err(format!("package {name} has no test target {test}"));
            }
            sources
        }
        None => {
            let mut all = ws.sources_under(package, "src");
            all.extend(ws.sources_under(package, "tests"));
            all
        }
    };
    for filter in a.free.iter().flat_map(|f| alternatives(f)) {
        let mut found = false;
        for file in &sources {
            if ws.course.read(file)?.contains(&filter) {
                found = true;
            }
        }
        if !found {
            return Err(format!("no test of {name} is named like {filter:?}"));
        }
    }
    if a.features.iter().any(|f| f == "exercises") {
        let in_loop = ws.ci.lines().any(|l| {
            l.trim_start().starts_with("for package in ")
                && l.split_whitespace()
                    .any(|w| w.trim_end_matches(';') == name)
        });
        if !in_loop {
            return Err(format!(".ci/run's exercise step does not name {name}"));
        }
        return Ok(Checked::InCi(
            ".ci/run's exercise step, with the answers".into(),
        ));
    }
    Ok(Checked::InCi("`cargo test --workspace`".into()))
}

/// `[a|b|c]` is the book's way to offer one of several filters; a plain word is one.
fn alternatives(word: &str) -> Vec<String> {
    match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
        Some(inner) => inner.split('|').map(str::to_string).collect(),
        None => vec![word.to_string()],
    }
}

fn check_bench(ws: &Workspace, words: &[String], run: bool) -> Result<Checked, String> {
    let a = cargo_args(words)?;
    let name = a.package.clone().ok_or("`cargo bench` without -p")?;
    let package = ws.package(&name)?;
    let benches = ws.sources_under(package, "benches");
    match &a.bench {
        Some(bench) if !ws.has_file(&format!("{}/benches/{bench}.rs", package.dir)) => {
            return Err(format!("package {name} has no bench {bench}"));
        }
        None if benches.is_empty() => return Err(format!("package {name} has no benches")),
        _ => {}
    }
    if !run {
        return Ok(Checked::Static("--static".into()));
    }
    // criterion runs each benchmark once when the bench target runs as a test; the GPU
    // kernels' benchmarks are only built here.
    let mut args = vec!["test", "--quiet", "-p", &name];
    match &a.bench {
        Some(bench) => args.extend(["--bench", bench]),
        None => args.push("--benches"),
    }
    if name == "kernels" {
        args.push("--no-run");
        run_cargo(ws, &args, &[])?;
        return Ok(Checked::Built("its benchmarks need an NVIDIA GPU".into()));
    }
    run_cargo(ws, &args, &[])?;
    Ok(Checked::Ran)
}

fn check_build(ws: &Workspace, words: &[String]) -> Result<Checked, String> {
    let a = cargo_args(words)?;
    let name = a.package.clone().ok_or("`cargo build` without -p")?;
    let package = ws.package(&name)?;
    ws.check_features(&name, package, &a.features)?;
    let step = if a.features.is_empty() {
        "`cargo test --workspace`".to_string()
    } else {
        let needle = format!("-p {name} --features {}", a.features.join(","));
        if !ws.ci.contains(&needle) {
            return Err(format!(".ci/run never builds `{needle}`"));
        }
        format!("`cargo check {needle}`")
    };
    Ok(Checked::InCi(step))
}

fn check_xtask(ws: &Workspace, words: &[String]) -> Result<Checked, String> {
    match words.first().map(String::as_str) {
        Some("starter") => {
            let mut it = words[1..].iter();
            while let Some(w) = it.next() {
                match w.as_str() {
                    "--phase" => {
                        let id = it.next().ok_or("--phase needs a chapter")?;
                        let key = chapter_key(id).ok_or(format!("bad chapter {id:?}"))?;
                        if !ws.course.chapters.contains_key(&key) {
                            return Err(format!("no chapter {id}"));
                        }
                    }
                    "--out" => {
                        it.next().ok_or("--out needs a folder")?;
                    }
                    "--check" => {}
                    other => return Err(format!("xtask starter has no argument {other}")),
                }
            }
            Ok(Checked::InCi("`cargo xtask starter --check`".into()))
        }
        Some("regions") | Some("book") => Ok(Checked::InCi("`.ci/run`".into())),
        _ => Err("an unknown xtask command".into()),
    }
}

/// `nanoserve SUB ARGS`: run where quick and on the CPU, else parsed.
fn check_nanoserve(
    ws: &Workspace,
    package: &str,
    args: &[String],
    input: &[String],
    run: bool,
    server: &mut Option<Server>,
) -> Result<Checked, String> {
    ws.package(package)?;
    let sub = args.first().map(String::as_str).unwrap_or("");
    let on_gpu = args
        .windows(2)
        .any(|w| w[0] == "--device" && w[1].starts_with("cuda"));
    let mut cargo = vec!["run", "--quiet", "--profile", "test", "-p", package, "--"];
    cargo.extend(args.iter().map(String::as_str));
    if !run {
        return Ok(Checked::Static("--static".into()));
    }
    if on_gpu || !RUNNABLE.contains(&sub) {
        cargo.push("--help");
        run_cargo(ws, &cargo, &[])?;
        return Ok(Checked::Parsed);
    }
    match sub {
        "serve" => {
            cargo.extend(["--port", "0"]);
            *server = Some(Server::start(ws, &cargo)?);
            Ok(Checked::Ran)
        }
        "chat" if input.iter().any(|l| l.contains('<')) => {
            // `<system id>` stands for the id the chat printed when that chunk was registered:
            // a first run registers, a second runs every line with the ids filled in.
            let registered = run_cargo(ws, &cargo, &without_placeholders(input))?;
            let filled = fill_ids(input, &registered)?;
            check_chat_output(&run_cargo(ws, &cargo, &filled)?)?;
            Ok(Checked::Ran)
        }
        "chat" => {
            check_chat_output(&run_cargo(ws, &cargo, input)?)?;
            Ok(Checked::Ran)
        }
        _ => {
            run_cargo(ws, &cargo, input)?;
            Ok(Checked::Ran)
        }
    }
}

fn without_placeholders(input: &[String]) -> Vec<String> {
    input.iter().filter(|l| !l.contains('<')).cloned().collect()
}

/// Each `<KIND id>` of the input replaced by the id the chat printed for the first chunk of
/// that kind it registered (`registered system chunk 1a2b3c4d5e6f`).
fn fill_ids(input: &[String], output: &str) -> Result<Vec<String>, String> {
    let mut ids: BTreeMap<&str, &str> = BTreeMap::new();
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == "registered")
            .unwrap_or(words.len());
        if let [_, kind, "chunk", id, ..] = &words[at..] {
            ids.entry(kind).or_insert(id);
        }
    }
    input
        .iter()
        .map(|line| {
            let mut filled = line.clone();
            while let Some(start) = filled.find('<') {
                let end = filled[start..]
                    .find('>')
                    .map(|e| start + e)
                    .ok_or("an unclosed <placeholder>")?;
                let kind = filled[start + 1..end].trim_end_matches(" id").to_string();
                let id = ids
                    .get(kind.as_str())
                    .ok_or(format!("the chat registered no {kind} chunk"))?;
                filled.replace_range(start..=end, id);
            }
            Ok(filled)
        })
        .collect()
}

fn check_chat_output(output: &str) -> Result<(), String> {
    match output
        .lines()
        .find(|l| l.contains("error:") || l.contains("unknown command"))
    {
        Some(line) => Err(format!("the chat answered {line:?}")),
        None => Ok(()),
    }
}

/// `curl ... localhost:8000/PATH`: the path must be a route of the server; run against the
/// server the page started when curl is installed.
fn check_curl(
    ws: &Workspace,
    args: &[String],
    run: bool,
    server: &mut Option<Server>,
) -> Result<Checked, String> {
    let url = args
        .iter()
        .find(|a| a.contains("localhost:8000"))
        .ok_or("a curl command of the book talks to localhost:8000")?;
    let path = url
        .split_once("localhost:8000")
        .map(|(_, p)| p.split('?').next().unwrap_or(p))
        .unwrap_or("");
    let routes = ws.course.read("phase6-engine/server/src/routes.rs")?;
    if !routes.contains(&format!("\"{path}\"")) {
        return Err(format!("the server has no route {path}"));
    }
    let Some(server) = server.as_mut().filter(|_| run) else {
        return Ok(Checked::Static("no `serve` before it on the page".into()));
    };
    if Command::new("curl").arg("--version").output().is_err() {
        return Ok(Checked::Static("curl is not installed here".into()));
    }
    let mut curl = Command::new("curl");
    curl.args(["--fail", "--max-time", "120"]);
    for a in args {
        curl.arg(a.replace("localhost:8000", &server.addr));
    }
    let out = curl.output().map_err(|e| format!("cannot run curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Checked::Ran)
}

/// A `nanoserve serve` started on a free loopback port, stopped when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(ws: &Workspace, args: &[&str]) -> Result<Server, String> {
        let mut child = cargo(ws, args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the server: {e}"))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line
                    .split_once("http://")
                    .and_then(|(_, rest)| rest.split('/').next())
                {
                    let _ = tx.send(addr.to_string());
                }
            }
        });
        let mut server = Server {
            child,
            addr: String::new(),
        };
        server.addr = rx
            .recv_timeout(TIMEOUT)
            .map_err(|_| "the server did not say where it listens".to_string())?;
        // Ready once /health answers.
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if health(&server.addr) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("the server never answered /health".into())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn health(addr: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// `cargo ARGS`, to run at the workspace's root.
fn cargo(ws: &Workspace, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO"));
    command.args(args).current_dir(&ws.course.root);
    command
}

/// Runs `cargo ARGS` in the workspace with `input` on stdin; fails on a non-zero exit or
/// after [`TIMEOUT`]. Returns stdout and stderr.
fn run_cargo(ws: &Workspace, args: &[&str], input: &[String]) -> Result<String, String> {
    let mut child = cargo(ws, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let text: String = input.iter().map(|l| format!("{l}\n")).collect();
    std::thread::spawn(move || {
        let _ = stdin.write_all(text.as_bytes());
    });
    let out_reader = drain(child.stdout.take().expect("stdout is piped"));
    let err_reader = drain(child.stderr.take().expect("stderr is piped"));
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("`cargo {}` ran past {TIMEOUT:?}", args.join(" ")));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = format!(
        "{}{}",
        out_reader.join().unwrap_or_default(),
        err_reader.join().unwrap_or_default()
    );
    if !status.success() {
        let tail: Vec<&str> = output.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "`cargo {}` failed ({status}):\n{}",
            args.join(" "),
            tail.join("\n")
        ));
    }
    Ok(output)
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# A page\n\nRun `cargo test -p\nphase1` first, then `cargo bench -p phase1`.\n\n\
```sh\ncargo run -p nanoserve -- chat   # a conversation\n> /register system Hi\\n\n\
curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\\n  -d '{\"a\": 1}'\n```\n\n\
```rust\nlet x = \"cargo test\";\n```\n";

    #[test]
    fn commands_come_from_sh_blocks_and_inline_cargo_spans() {
        let found = commands("p.md", PAGE);
        let texts: Vec<(&str, usize)> = found.iter().map(|c| (c.text.as_str(), c.line)).collect();
        assert_eq!(
            texts,
            [
                ("cargo test -p phase1", 3),
                ("cargo bench -p phase1", 4),
                ("cargo run -p nanoserve -- chat", 7),
                (
                    "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{\"a\": 1}'",
                    9
                ),
            ]
        );
        assert_eq!(found[2].input, ["/register system Hi\\n"]);
    }

    #[test]
    fn words_split_like_a_shell_and_filters_offer_alternatives() {
        assert_eq!(
            words(r#"nanoserve generate "ROMEO:" 'a b' --x"#).unwrap(),
            ["nanoserve", "generate", "ROMEO:", "a b", "--x"]
        );
        assert!(words("say 'unclosed").is_err());
        assert_eq!(alternatives("[lfu|hit_rate]"), ["lfu", "hit_rate"]);
        assert_eq!(alternatives("watermark"), ["watermark"]);
        assert_eq!(strip_comment("cargo bench   # the benches"), "cargo bench");
        assert_eq!(strip_comment("echo 'a # b'"), "echo 'a # b'");
    }

    #[test]
    fn placeholders_take_the_ids_the_chat_printed() {
        let input = vec![
            "/register system Hi".to_string(),
            "/compose <system id> <context id> : ROMEO:".to_string(),
        ];
        let output =
            "> > registered system chunk 0123456789ab\n> registered context chunk ba9876543210\n";
        assert_eq!(without_placeholders(&input), input[..1]);
        assert_eq!(
            fill_ids(&input, output).unwrap()[1],
            "/compose 0123456789ab ba9876543210 : ROMEO:"
        );
        assert!(fill_ids(&input, "nothing registered").is_err());
    }
}
