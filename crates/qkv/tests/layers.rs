//! ARCHITECTURE.md's table of layers, enforced on the library's sources. The table is
//! the input: each row's layer number and the modules it lists. The rules:
//! - a module imports only modules of its own layer or lower ones, and the modules of
//!   one layer import each other without a cycle;
//! - inside the crate, nothing is imported through `lib.rs`'s re-exports
//!   (`crate::Tensor`): every path names the module that holds the item;
//! - inside a folder, a file imports a sibling by the sibling's own path, never through
//!   the folder's `mod.rs` (which declares the siblings, so that would be a circle), and
//!   the siblings import each other without a cycle.
//!
//! Paths are read from the code (comments and strings left out, and each file's
//! `#[cfg(test)]` tail); `$crate::` paths of exported macros are the macro's users'.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One file of the crate: its module path (`["attention", "tiled"]`) and its code.
struct Source {
    module: Vec<String>,
    file: String,
    code: String,
}

/// The modules of each layer, from ARCHITECTURE.md's table.
fn layers(architecture: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for line in architecture.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(layer), Some(modules)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Ok(layer) = layer.parse::<u32>() else {
            continue;
        };
        for name in modules.split('`').skip(1).step_by(2) {
            if !name.contains('/') {
                out.insert(name.to_string(), layer);
            }
        }
    }
    out
}

/// `text` without comments, string and char literals, and from the first
/// `#[cfg(test)]` on.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                i = end;
            }
            b'r' if matches!(b.get(i + 1), Some(b'#') | Some(b'"'))
                && !b[..i].last().is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                i = text[start..].find(&close).map_or(b.len(), |e| start + e + close.len());
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // a char literal ('x', '\n', '\u{..}'), not a lifetime ('a)
            b'\'' => {
                let lit = match (b.get(i + 1), b.get(i + 2)) {
                    (Some(b'\\'), _) => text[i + 1..].find('\'').map(|e| i + 1 + e + 1),
                    (Some(_), _) => {
                        let c = text[i + 1..].chars().next().expect("a char");
                        let after = i + 1 + c.len_utf8();
                        (b.get(after) == Some(&b'\'')).then_some(after + 1)
                    }
                    _ => None,
                };
                match lit {
                    Some(end) => {
                        out.push_str("' '");
                        i = end;
                    }
                    None => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            _ => {
                let c = text[i..].chars().next().expect("a char");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that starts with `crate::`, `super::` or `self::` in `code`, as its
/// segments (`{a, b::c}` groups expanded, globs dropped).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|k| rest.find(k).map(|i| (i, *k)))
        .min()
    {
        let (i, head) = at;
        let before = rest[..i].chars().next_back();
        let tail = &rest[i + head.len()..];
        rest = tail;
        // a longer identifier (`my_crate::`), a `$crate::` macro path, or a path
        // continued (`super::super::`, read from its start)
        if before.is_some_and(|c| ident_char(c) || c == '$' || c == ':') {
            continue;
        }
        let start = vec![head.trim_end_matches("::").to_string()];
        expand(tail, start, &mut out);
    }
    out
}

/// Reads the path continuing after `prefix::` at `text` into `out`.
fn expand(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    let mut s = text.trim_start();
    loop {
        if let Some(group) = s.strip_prefix('{') {
            // split the group at its top-level commas
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&std::mem::take(&mut item), path.clone(), out);
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            expand(&item, path, out);
            return;
        }
        let name: String = s.chars().take_while(|&c| ident_char(c)).collect();
        if name.is_empty() {
            // `*`, or the end of the path
            if path.len() > 1 && !s.starts_with('*') {
                out.push(path);
            }
            return;
        }
        s = &s[name.len()..];
        path.push(name);
        match s.strip_prefix("::") {
            Some(next) => s = next.trim_start(),
            None => {
                out.push(path);
                return;
            }
        }
    }
}

/// `path` (from the file of module `module`) as a path from the crate root; `None`
/// where `super` climbs past it.
fn absolute(module: &[String], path: &[String]) -> Option<Vec<String>> {
    // `super` of a.rs is its folder's module; of a/mod.rs, a's parent
    let mut base: Vec<String> = module.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Whether `module` (a path from the root) is a module of the crate in `src`.
fn is_module(src: &Path, module: &[String]) -> bool {
    let dir: PathBuf = module.iter().collect();
    let dir = src.join(dir);
    dir.with_extension("rs").is_file() || dir.join("mod.rs").is_file()
}

fn sources(src: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut module: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if module.last().is_some_and(|m| m == "mod" || m == "lib") {
                module.pop();
            }
            out.push(Source {
                module,
                file: rel.display().to_string(),
                code: code_of(&std::fs::read_to_string(&path).unwrap()),
            });
        }
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

/// The rules of the module comment over `sources` of the crate in `src`, with
/// `layer` from the table: every breach, described.
fn breaches(src: &Path, layer: &BTreeMap<String, u32>, sources: &[Source]) -> Vec<String> {
    let mut found = BTreeSet::new();
    // edges between top-level modules of one layer, and between siblings of a folder
    let mut same_layer: BTreeSet<(String, String)> = BTreeSet::new();
    let mut siblings: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for s in sources {
        let Some(top) = s.module.first() else {
            continue; // lib.rs: the facade
        };
        let Some(&own) = layer.get(top) else {
            found.insert(format!("{}: module `{top}` is in no row of the table", s.file));
            continue;
        };
        for path in paths(&s.code) {
            let Some(abs) = absolute(&s.module, &path) else {
                continue;
            };
            let shown = path.join("::");
            let Some(target) = abs.first() else {
                continue;
            };
            if !is_module(src, &abs[..1]) {
                found.insert(format!(
                    "{}: `{shown}` goes through lib.rs's re-exports: name the module that holds it",
                    s.file
                ));
                continue;
            }
            if target != top {
                match layer.get(target) {
                    None => {
                        found.insert(format!("{}: `{target}` is in no row of the table", s.file));
                    }
                    Some(&l) if l > own => {
                        found.insert(format!(
                            "{}: `{shown}`: layer {own} (`{top}`) imports layer {l} (`{target}`)",
                            s.file
                        ));
                    }
                    Some(&l) if l == own => {
                        same_layer.insert((top.clone(), target.clone()));
                    }
                    _ => {}
                }
                continue;
            }
            // inside one top-level module: the folder both paths share, and the
            // entries of it each lies in
            let common = s.module.iter().zip(&abs).take_while(|(a, b)| a == b).count();
            // a path to the file itself or to a folder it lies in (`pub(in crate::x)`)
            // names no item
            let (Some(from), true) = (s.module.get(common), abs.len() > common) else {
                continue;
            };
            let folder = s.module[..common].to_vec();
            match is_module(src, &abs[..=common]) {
                true => {
                    siblings
                        .entry(folder)
                        .or_default()
                        .insert((from.clone(), abs[common].clone()));
                }
                false => {
                    found.insert(format!(
                        "{}: `{shown}` is read through {}'s mod.rs, which declares this file: import it from the file that defines it",
                        s.file,
                        folder.join("/")
                    ));
                }
            }
        }
    }
    if let Some(cycle) = cycle(&same_layer) {
        found.insert(format!(
            "modules of one layer import each other in a circle: {}",
            cycle.join(" → ")
        ));
    }
    for (folder, edges) in &siblings {
        if let Some(cycle) = cycle(edges) {
            found.insert(format!(
                "files of {} import each other in a circle: {}",
                folder.join("/"),
                cycle.join(" → ")
            ));
        }
    }
    found.into_iter().collect()
}

/// A cycle of `edges`, if there is one, as the names along it (the first repeated).
fn cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    // depth-first search with the path kept
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|&p| p == n) {
            let mut c: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            c.push(n.to_string());
            return Some(c);
        }
        if !done.insert(n) {
            return None;
        }
        path.push(n);
        for &m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for &start in next.keys() {
        let mut path = Vec::new();
        done.clear();
        if let Some(c) = visit(start, &next, &mut path, &mut done) {
            return Some(c);
        }
    }
    None
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_library_keeps_the_table_of_layers() {
    let table = std::fs::read_to_string(crate_dir().join("../../ARCHITECTURE.md")).unwrap();
    let layer = layers(&table);
    assert!(layer.len() >= 16, "the table lists too few modules: {layer:?}");
    let src = crate_dir().join("src");
    let all = sources(&src);
    // every module lib.rs declares has a row
    let lib = &all.iter().find(|s| s.file == "lib.rs").unwrap().code;
    for line in lib.lines() {
        if let Some(name) = line.trim().strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';');
            assert!(layer.contains_key(name), "lib.rs declares `{name}`, which no row lists");
        }
    }
    let found = breaches(&src, &layer, &all);
    assert!(found.is_empty(), "{} breaches:\n{}", found.len(), found.join("\n"));
}

/// The check itself, on a small tree written here: each wrong import is caught.
#[test]
fn the_check_catches_each_kind_of_breach() {
    let src = std::env::temp_dir().join(format!("qkv-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    let write = |file: &str, text: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod low;\npub mod high;\npub mod kernels;\npub use low::Thing;\n");
    write("low.rs", "use crate::high::Model; // lower imports higher\npub struct Thing;\n");
    write("high.rs", "use crate::Thing; /* through the facade */\nuse crate::low::{self, Thing as T};\n");
    write("kernels/mod.rs", "mod a;\nmod b;\npub struct Out;\n");
    write("kernels/a.rs", "use super::Out;\nuse super::b::run;\n");
    write("kernels/b.rs", "use super::a::{x, y::z};\nlet s = \"crate::high::Hidden\"; // a string\n");
    let table = "| 0 | `low`, `kernels` | … |\n| 1 | `high` | … |\n";
    let found = breaches(&src, &layers(table), &sources(&src));
    let expect = [
        "low.rs: `crate::high::Model`: layer 0 (`low`) imports layer 1 (`high`)",
        "high.rs: `crate::Thing` goes through lib.rs's re-exports",
        "kernels/a.rs: `super::Out` is read through kernels's mod.rs",
        "files of kernels import each other in a circle: a → b → a",
    ];
    for e in expect {
        assert!(found.iter().any(|f| f.starts_with(e)), "not caught: {e}\nfound:\n{}", found.join("\n"));
    }
    assert_eq!(found.len(), expect.len(), "{}", found.join("\n"));
    std::fs::remove_dir_all(&src).unwrap();
}
