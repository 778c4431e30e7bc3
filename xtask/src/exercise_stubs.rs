//! Turning exercise files into stubs: reference answers are cut, their `todo!`s stay.
//!
//! An exercise body in the reference workspace reads
//!
//! ```text
//! if !cfg!(feature = "solutions") {
//!     todo!("exercise 4.1: ...");
//! }
//! // BEGIN SOLUTION
//! ...the reference answer...
//! // END SOLUTION
//! ```
//!
//! so the answer is type-checked in every build but runs only with `--features solutions`.
//! A starter must not carry the answer at all: the guard and the region become the bare
//! `todo!("exercise 4.1: ...")`, the body a student starts from. Such a bare stub is read back
//! as the exercise it is, so the same tool lists a starter's exercises.

const GUARD: &str = "if !cfg!(feature = \"solutions\") {";
const BEGIN: &str = "// BEGIN SOLUTION";
const END: &str = "// END SOLUTION";

/// Replaces every guarded solution region of an exercise file with its `todo!`. Returns the
/// new source and the `todo!` messages in order (bare stubs included). A region without the guard, or a guard
/// without a region, is an error: either would leak an answer or leave a body empty.
pub fn strip_solutions(source: &str) -> Result<(String, Vec<String>), String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::with_capacity(source.len());
    let mut todos = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let at = format!("line {}", i + 1);
        match line.trim() {
            GUARD => {
                let todo = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
                let message = todo
                    .strip_prefix("todo!(")
                    .and_then(|t| t.strip_suffix(");"))
                    .filter(|m| m.starts_with("\"exercise "))
                    .ok_or_else(|| {
                        format!("{at}: the guard must hold one todo!(\"exercise ...\")")
                    })?;
                if lines.get(i + 2).map(|l| l.trim()) != Some("}")
                    || lines.get(i + 3).map(|l| l.trim()) != Some(BEGIN)
                {
                    return Err(format!(
                        "{at}: the guard must close and be followed by {BEGIN}"
                    ));
                }
                let end = (i + 4..lines.len())
                    .find(|&j| matches!(lines[j].trim(), BEGIN | END))
                    .filter(|&j| lines[j].trim() == END)
                    .ok_or_else(|| format!("{at}: {BEGIN} without {END}"))?;
                let indent = &line[..line.len() - line.trim_start().len()];
                out.push_str(&format!("{indent}todo!({message})\n"));
                todos.push(message.trim_matches('"').to_string());
                i = end + 1;
            }
            BEGIN | END => {
                return Err(format!(
                    "{at}: an exercise's solution region must follow its `{GUARD}` guard"
                ));
            }
            other => {
                if let Some(message) = bare_stub(other) {
                    todos.push(message.to_string());
                }
                out.push_str(line);
                out.push('\n');
                i += 1;
            }
        }
    }
    Ok((out, todos))
}

/// The message of a stub already handed out: `todo!("exercise 4.1: ...")`.
fn bare_stub(line: &str) -> Option<&str> {
    let message = line.strip_prefix("todo!(\"")?;
    let message = message
        .strip_suffix("\");")
        .or_else(|| message.strip_suffix("\")"))?;
    message.starts_with("exercise ").then_some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"impl Policy {
    /// Picks the victim.
    pub fn victim(&self) -> Option<u32> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 4.1: pick the least frequently used leaf");
        }
        // BEGIN SOLUTION
        self.leaves.iter().min().copied()
        // END SOLUTION
    }
}
"#;

    #[test]
    fn guarded_regions_become_their_todo() {
        let (out, todos) = strip_solutions(SOURCE).unwrap();
        assert_eq!(
            out,
            "impl Policy {\n    /// Picks the victim.\n    pub fn victim(&self) -> Option<u32> {\n        todo!(\"exercise 4.1: pick the least frequently used leaf\")\n    }\n}\n"
        );
        assert_eq!(todos, ["exercise 4.1: pick the least frequently used leaf"]);
        // A starter's stub lists the same exercise and stays as it is.
        assert_eq!(strip_solutions(&out).unwrap(), (out.clone(), todos));
    }

    #[test]
    fn unguarded_or_unclosed_regions_are_errors() {
        let unguarded = "fn f() -> u32 {\n    // BEGIN SOLUTION\n    1\n    // END SOLUTION\n}\n";
        assert!(strip_solutions(unguarded).is_err());
        let unclosed = SOURCE.replace("        // END SOLUTION\n", "");
        assert!(strip_solutions(&unclosed).is_err());
        let no_region = SOURCE.replace("        // BEGIN SOLUTION\n", "");
        assert!(strip_solutions(&no_region).is_err());
        let chapter_todo = SOURCE.replace("exercise 4.1", "chapter 4.1");
        assert!(strip_solutions(&chapter_todo).is_err());
    }

    #[test]
    fn files_without_exercises_are_unchanged() {
        let src = "pub mod lfu;\n";
        assert_eq!(strip_solutions(src).unwrap(), (src.to_string(), vec![]));
    }
}
