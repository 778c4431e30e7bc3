//! Turning reference code into exercise code: solution regions become `todo!()`s.
//!
//! A lesson body sits between a `// BEGIN SOLUTION` and an `// END SOLUTION` line, always at
//! the tail of a function body, so replacing it with a `todo!(...)` still type-checks. The
//! message names the lesson's number and the function to write, taken from the nearest `fn`
//! above the region, and the first sentence of its doc comment. The marker lines stay around
//! the `todo!`: they show the student where to write, and they let `cargo xtask starter` run
//! in a starter find the regions again.

const BEGIN: &str = "// BEGIN SOLUTION";
const END: &str = "// END SOLUTION";

/// One solution region of a file: the function it ends and the first sentence of its docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub function: String,
    pub hint: String,
}

/// The solution regions of `source`, in source order.
pub fn regions(source: &str) -> Result<Vec<Region>, String> {
    Ok(scan(source)?.into_iter().map(|(_, _, r)| r).collect())
}

/// Replaces the body of the `i`-th solution region of `source` with a `todo!` naming
/// `sections[i]` (`chapter 1.3`), keeping the marker lines.
pub fn replace_regions(source: &str, sections: &[String]) -> Result<String, String> {
    let found = scan(source)?;
    if found.len() != sections.len() {
        return Err(format!(
            "{} solution regions but {} section numbers",
            found.len(),
            sections.len()
        ));
    }
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::with_capacity(source.len());
    let mut next = 0;
    for ((begin, end, region), section) in found.iter().zip(sections) {
        for line in &lines[next..=*begin] {
            out.push_str(line);
            out.push('\n');
        }
        let marker = lines[*begin];
        let indent = &marker[..marker.len() - marker.trim_start().len()];
        out.push_str(&format!(
            "{indent}todo!({:?})\n",
            todo_message(section, region)
        ));
        out.push_str(lines[*end]);
        out.push('\n');
        next = end + 1;
    }
    for line in &lines[next..] {
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// The text of a lesson's `todo!`: `chapter 1.3: write `allocate`: <hint>`.
pub fn todo_message(section: &str, region: &Region) -> String {
    format!("{section}: write `{}`: {}", region.function, region.hint)
}

/// Every region as (line of its BEGIN, line of its END, what it is).
fn scan(source: &str) -> Result<Vec<(usize, usize, Region)>, String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        match lines[i].trim() {
            END => return Err(format!("line {}: END SOLUTION without BEGIN", i + 1)),
            BEGIN => {
                let end = (i + 1..lines.len())
                    .find(|&j| matches!(lines[j].trim(), BEGIN | END))
                    .filter(|&j| lines[j].trim() == END)
                    .ok_or_else(|| format!("line {}: BEGIN SOLUTION without END", i + 1))?;
                let (function, hint) = describe(&lines[..i]);
                if hint.is_empty() {
                    return Err(format!(
                        "line {}: `{function}` has no doc comment: its first sentence is the \
                         hint of the student's todo!",
                        i + 1
                    ));
                }
                found.push((i, end, Region { function, hint }));
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    Ok(found)
}

/// The name of the nearest function above a region and the first sentence of its docs.
fn describe(before: &[&str]) -> (String, String) {
    let Some(at) = before.iter().rposition(|l| fn_name(l).is_some()) else {
        return ("this function".into(), String::new());
    };
    let name = fn_name(before[at]).unwrap_or_default();
    let mut docs: Vec<&str> = before[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .skip_while(|l| l.starts_with("#["))
        .take_while(|l| l.starts_with("///"))
        .map(|l| l.trim_start_matches("///").trim())
        .collect();
    docs.reverse();
    let text = docs.join(" ");
    let sentence = match text.find(". ") {
        Some(end) => &text[..=end],
        None => text.as_str(),
    };
    (name, sentence.trim().to_string())
}

fn fn_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    let rest = ["pub fn ", "fn ", "pub(crate) fn "]
        .iter()
        .find_map(|p| t.strip_prefix(p))?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"impl Pool {
    /// Takes a free page. Errors when none is left.
    #[inline]
    pub fn allocate(&mut self) -> Result<u32, Error> {
        // BEGIN SOLUTION
        let p = self.free.pop()?;
        Ok(p)
        // END SOLUTION
    }

    /// Adds one.
    fn bump(&self) -> usize {
        let x = 1;
        // BEGIN SOLUTION
        x + 1
        // END SOLUTION
    }
}
"#;

    #[test]
    fn regions_are_named_after_their_function_and_first_doc_sentence() {
        let found = regions(SOURCE).unwrap();
        assert_eq!(
            found,
            [
                Region {
                    function: "allocate".into(),
                    hint: "Takes a free page.".into()
                },
                Region {
                    function: "bump".into(),
                    hint: "Adds one.".into()
                }
            ]
        );
    }

    #[test]
    fn bodies_become_numbered_todos_between_their_markers() {
        let sections = ["chapter 1.4".to_string(), "chapter 1.2".to_string()];
        let out = replace_regions(SOURCE, &sections).unwrap();
        assert!(!out.contains("self.free.pop()"));
        assert!(out.contains(
            "        // BEGIN SOLUTION\n        todo!(\"chapter 1.4: write `allocate`: Takes a free page.\")\n        // END SOLUTION\n"
        ));
        assert!(out.contains(
            "        let x = 1;\n        // BEGIN SOLUTION\n        todo!(\"chapter 1.2: write `bump`: Adds one.\")\n"
        ));
        // A starter's todo is itself a region: handing it out again changes nothing.
        assert_eq!(replace_regions(&out, &sections).unwrap(), out);
        assert!(replace_regions(SOURCE, &sections[..1]).is_err());
    }

    #[test]
    fn unbalanced_markers_and_undocumented_lessons_are_errors() {
        assert!(regions("// BEGIN SOLUTION\nx\n").is_err());
        assert!(regions("x\n// END SOLUTION\n").is_err());
        assert!(regions("// BEGIN SOLUTION\n// BEGIN SOLUTION\n// END SOLUTION\n").is_err());
        let undocumented =
            "fn f() -> u32 {\n    // BEGIN SOLUTION\n    1\n    // END SOLUTION\n}\n";
        let e = regions(undocumented).unwrap_err();
        assert!(e.contains("`f` has no doc comment"), "{e}");
    }

    #[test]
    fn files_without_regions_are_unchanged() {
        let src = "fn main() {}\n";
        assert_eq!(regions(src).unwrap(), vec![]);
        assert_eq!(replace_regions(src, &[]).unwrap(), src);
    }
}
