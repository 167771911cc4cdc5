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

/// `text` without comments, string and char literals, and test modules
/// (`#[cfg(test)] mod … { … }`).
fn code_of(text: &str) -> String {
    let mut code = plain(text);
    while let Some(at) = code.find("#[cfg(test)]") {
        let end = code[at..]
            .find('{')
            .and_then(|open| block_end(&code, at + open))
            .unwrap_or(code.len());
        code.replace_range(at..end, "");
    }
    code
}

/// The position just past the `}` that closes the `{` at `open`.
fn block_end(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    for (j, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + j + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` without comments, string and char literals.
fn plain(text: &str) -> String {
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
                && !b[..i]
                    .last()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                i = text[start..]
                    .find(&close)
                    .map_or(b.len(), |e| start + e + close.len());
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

/// The inline modules of `code` (`mod portable { … }`): each one's name and the span
/// of its body.
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("mod ") {
        if code[..i].chars().next_back().is_some_and(ident_char) {
            continue;
        }
        let rest = &code[i + 4..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|&c| ident_char(c))
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        if let Some(end) = block_end(code, open) {
            out.push((name, open..end));
        }
    }
    out
}

/// The inline modules enclosing position `at` of `code`, outermost first.
fn enclosing(inline: &[(String, std::ops::Range<usize>)], at: usize) -> Vec<String> {
    let mut around: Vec<&(String, std::ops::Range<usize>)> =
        inline.iter().filter(|(_, r)| r.contains(&at)).collect();
    around.sort_by_key(|(_, r)| r.start);
    around.into_iter().map(|(n, _)| n.clone()).collect()
}

/// Every path that starts with `crate::`, `super::` or `self::` in `code`, as its
/// segments (`{a, b::c}` groups expanded, globs dropped), each with the inline modules
/// it is written in (which `super` and `self` are read from).
fn paths(code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let inline = inline_modules(code);
    let mut out = Vec::new();
    for head in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(head) {
            // a longer identifier (`my_crate::`), a `$crate::` macro path, or the
            // middle of a path (`super::super::`, read from its start)
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| ident_char(c) || c == '$' || c == ':') {
                continue;
            }
            // an exported macro (`crate::positive!`) lives at the root by definition
            let rest = &code[i + head.len()..];
            let name_len = rest.chars().take_while(|&c| ident_char(c)).count();
            if rest[name_len..].starts_with('!') {
                continue;
            }
            let start = vec![head.trim_end_matches("::").to_string()];
            for (path, _) in tree(rest, start) {
                if path.len() > 1 {
                    out.push((enclosing(&inline, i), path));
                }
            }
        }
    }
    out
}

/// The names the `use` declarations of `code` bind, each with the inline modules it is
/// written in and the path it stands for (`use a::{b as c, d::e};` binds `c` → `a::b`
/// and `e` → `a::d::e`).
fn bindings(code: &str) -> Vec<(Vec<String>, String, Vec<String>)> {
    let inline = inline_modules(code);
    let mut out = Vec::new();
    for (i, _) in code.match_indices("use ") {
        if code[..i].chars().next_back().is_some_and(ident_char) {
            continue;
        }
        let text = &code[i + 4..];
        let text = text.trim_start().trim_start_matches("::");
        for (path, name) in tree(text, Vec::new()) {
            if let Some(name) = name {
                out.push((enclosing(&inline, i), name, path));
            }
        }
    }
    out
}

/// The use-tree at the start of `text` after `prefix`: each path it names, with the
/// name it binds (`None` for a glob).
fn tree(text: &str, prefix: Vec<String>) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    expand(text, prefix, &mut out);
    out
}

fn expand(text: &str, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix;
    let mut s = text.trim_start();
    loop {
        if let Some(group) = s.strip_prefix('{') {
            // the group's items, split at its top-level commas
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
        if s.starts_with('*') {
            out.push((path, None));
            return;
        }
        let name: String = s.chars().take_while(|&c| ident_char(c)).collect();
        if name.is_empty() {
            return;
        }
        s = s[name.len()..].trim_start();
        if let Some(next) = s.strip_prefix("::") {
            path.push(name);
            s = next.trim_start();
            continue;
        }
        // `self` in a group binds the group's own last segment
        let bound = match name.as_str() {
            "self" => path.last().cloned(),
            _ => {
                path.push(name.clone());
                Some(name)
            }
        };
        let alias = s.strip_prefix("as ").map(|a| {
            a.trim_start()
                .chars()
                .take_while(|&c| ident_char(c))
                .collect()
        });
        out.push((path, alias.or(bound)));
        return;
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

/// The module path of the file that defines what `abs` (a path from the root) names,
/// following the `use` bindings of the module files along it (re-exports), or `None`
/// when it leads out of the crate.
fn defining(
    src: &Path,
    bound: &BTreeMap<Vec<String>, Vec<(String, Vec<String>)>>,
    abs: Vec<String>,
) -> Option<Vec<String>> {
    let mut path = abs;
    for _ in 0..16 {
        let mut k = 0;
        while k < path.len() && is_module(src, &path[..=k]) {
            k += 1;
        }
        let module = path[..k].to_vec();
        let Some(name) = path.get(k) else {
            return Some(module);
        };
        let Some((_, to)) = bound
            .get(&module)
            .and_then(|b| b.iter().find(|(n, _)| n == name))
        else {
            return Some(module);
        };
        // a binding's path is read from its own module: `crate::`, `super::`, `self::`,
        // a child module, or another crate
        let to = match to.first().map(String::as_str) {
            Some("crate" | "super" | "self") => absolute(&module, to)?,
            Some(first) if is_module(src, &[module.clone(), vec![first.to_string()]].concat()) => {
                [module.clone(), to.clone()].concat()
            }
            _ => return None,
        };
        path = [to, path[k + 1..].to_vec()].concat();
    }
    None
}

/// The rules of the module comment over `sources` of the crate in `src`, with
/// `layer` from the table: every breach, described.
fn breaches(src: &Path, layer: &BTreeMap<String, u32>, sources: &[Source]) -> Vec<String> {
    let mut bound: BTreeMap<Vec<String>, Vec<(String, Vec<String>)>> = BTreeMap::new();
    for s in sources {
        for (inline, name, path) in bindings(&s.code) {
            let module = [s.module.clone(), inline].concat();
            bound.entry(module).or_default().push((name, path));
        }
    }
    let mut found = BTreeSet::new();
    // edges between top-level modules of one layer, and between siblings of a folder
    let mut same_layer: BTreeSet<(String, String)> = BTreeSet::new();
    let mut siblings: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for s in sources {
        let Some(top) = s.module.first() else {
            continue; // lib.rs: the facade
        };
        let Some(&own) = layer.get(top) else {
            found.insert(format!(
                "{}: module `{top}` is in no row of the table",
                s.file
            ));
            continue;
        };
        for (inline, path) in paths(&s.code) {
            let shown = path.join("::");
            let Some(abs) = absolute(&[s.module.clone(), inline].concat(), &path) else {
                continue;
            };
            if abs.is_empty() {
                continue;
            }
            if !is_module(src, &abs[..1]) {
                found.insert(format!(
                    "{}: `{shown}` goes through lib.rs's re-exports: name the module that holds it",
                    s.file
                ));
                continue;
            }
            let Some(def) = defining(src, &bound, abs) else {
                continue;
            };
            let target = &def[0];
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
            let common = s
                .module
                .iter()
                .zip(&def)
                .take_while(|(a, b)| a == b)
                .count();
            match (s.module.get(common), def.get(common)) {
                // an item of a folder's mod.rs, read by a file that mod.rs declares
                (Some(_), None) => {
                    found.insert(format!(
                        "{}: `{shown}` is defined in {}'s mod.rs, which declares this file (a circle): move it to a file of its own",
                        s.file,
                        def.join("/")
                    ));
                }
                (Some(from), Some(to)) => {
                    let folder = s.module[..common].to_vec();
                    let edges = siblings.entry(folder).or_default();
                    edges.insert((from.clone(), to.clone()));
                }
                // a file's own items, or a mod.rs using what it declares
                (None, _) => {}
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
            let folder = match folder.is_empty() {
                true => "the crate".to_string(),
                false => folder.join("/"),
            };
            found.insert(format!(
                "files of {folder} import each other in a circle: {}",
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
    assert!(
        layer.len() >= 16,
        "the table lists too few modules: {layer:?}"
    );
    let src = crate_dir().join("src");
    let all = sources(&src);
    // every module lib.rs declares has a row
    let lib = &all.iter().find(|s| s.file == "lib.rs").unwrap().code;
    for line in lib.lines() {
        if let Some(name) = line.trim().strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';');
            assert!(
                layer.contains_key(name),
                "lib.rs declares `{name}`, which no row lists"
            );
        }
    }
    let found = breaches(&src, &layer, &all);
    assert!(
        found.is_empty(),
        "{} breaches:\n{}",
        found.len(),
        found.join("\n")
    );
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
    write(
        "lib.rs",
        "pub mod low;\npub mod high;\npub mod kernels;\npub use low::Thing;\n",
    );
    write(
        "low.rs",
        "use crate::high::Model; // lower imports higher\npub struct Thing;\n",
    );
    write(
        "high.rs",
        "use crate::Thing; /* through the facade */\nuse crate::low::{self, Thing as T};\n",
    );
    write("kernels/mod.rs", "mod a;\nmod b;\npub struct Out;\n");
    write("kernels/a.rs", "use super::Out;\nuse super::b::run;\n");
    write(
        "kernels/b.rs",
        "use super::a::{x, y::z};\nlet s = \"crate::high::Hidden\"; // a string\n",
    );
    let table = "| 0 | `low`, `kernels` | … |\n| 1 | `high` | … |\n";
    let found = breaches(&src, &layers(table), &sources(&src));
    let expect = [
        "low.rs: `crate::high::Model`: layer 0 (`low`) imports layer 1 (`high`)",
        "high.rs: `crate::Thing` goes through lib.rs's re-exports",
        "kernels/a.rs: `super::Out` is defined in kernels's mod.rs",
        "files of kernels import each other in a circle: a → b → a",
    ];
    for e in expect {
        assert!(
            found.iter().any(|f| f.starts_with(e)),
            "not caught: {e}\nfound:\n{}",
            found.join("\n")
        );
    }
    assert_eq!(found.len(), expect.len(), "{}", found.join("\n"));
    std::fs::remove_dir_all(&src).unwrap();
}
