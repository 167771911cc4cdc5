//! ARCHITECTURE.md's tables of layers, enforced on the sources of each crate: the
//! library (`crates/qkv/src`), the `qkv` binary (`crates/qkv-cli/src`) and the Python
//! package (`crates/qkv-py/src`). Each table is the input: every row's layer, its
//! modules and what they may import. The rules:
//! - a module imports only what its row's "may import" cell names: whole layers below
//!   it (`layers 0–2`), modules by name, or its row's other modules (`each other`);
//!   the modules of one layer import each other without a cycle;
//! - inside the crate, nothing is imported through the root's re-exports
//!   (`crate::Tensor`): every path names the module that holds the item;
//! - inside a folder, a file imports a sibling by the sibling's own path: never an item
//!   its folder's `mod.rs` defines (which declares the siblings, so that would be a
//!   circle), nor one that `mod.rs` re-exports; the siblings import each other without
//!   a cycle.
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

/// What a module may import, from its row of a table.
#[derive(Clone, Debug, Default)]
struct Row {
    layer: u32,
    /// the modules of its row
    mates: BTreeSet<String>,
    /// whole layers below it, inclusive
    layers: Option<(u32, u32)>,
    /// modules named in the cell
    names: BTreeSet<String>,
    /// the row's modules import each other
    each_other: bool,
}

impl Row {
    /// Whether a module of this row may import `target` (of `row`).
    fn allows(&self, target: &str, row: &Row) -> bool {
        self.names.contains(target)
            || (self.each_other && self.mates.contains(target))
            || self
                .layers
                .is_some_and(|(lo, hi)| (lo..=hi).contains(&row.layer))
    }
}

/// The table under the heading `heading` (the first table after that line).
fn section<'a>(architecture: &'a str, heading: &str) -> &'a str {
    let at = architecture
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no heading {heading:?}"));
    let rest = &architecture[at + heading.len() + 2..];
    let table = rest.find("\n|").map_or(rest, |t| &rest[t + 1..]);
    let end = table.find("\n\n").unwrap_or(table.len());
    &table[..end]
}

/// Each module's row of `table` (markdown: layer | modules | what it is | may import).
/// A "may import" cell lists, between commas, `layer N` or `layers A–B` (below the
/// row's own layer), modules in backticks, `each other`, `nothing`, or `the library`
/// (another crate, which these rules do not reach). Anything else is an error, so the
/// cell cannot say more than the check reads.
fn layers(table: &str) -> BTreeMap<String, Row> {
    let mut out = BTreeMap::new();
    for line in table.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(layer), Some(modules), Some(may)) = (cells.get(1), cells.get(2), cells.get(4))
        else {
            continue;
        };
        let Ok(layer) = layer.parse::<u32>() else {
            continue;
        };
        let mut row = Row {
            layer,
            mates: ticked(modules).collect(),
            ..Row::default()
        };
        for item in may.split(',').map(str::trim) {
            let numbers = item
                .strip_prefix("layers ")
                .or_else(|| item.strip_prefix("layer "));
            if let Some(numbers) = numbers {
                let (lo, hi) = numbers.split_once('–').unwrap_or((numbers, numbers));
                let (lo, hi): (u32, u32) = (lo.parse().unwrap(), hi.parse().unwrap());
                assert!(hi < layer, "{line}: `{item}` is not below layer {layer}");
                row.layers = Some((lo, hi));
            } else if item == "each other" {
                row.each_other = true;
            } else if item.starts_with('`') && item.ends_with('`') {
                row.names.extend(ticked(item));
            } else {
                assert!(
                    item == "nothing" || item == "the library",
                    "{line}: the check cannot read `{item}` in \"may import\""
                );
            }
        }
        for name in row.mates.clone() {
            out.insert(name, row.clone());
        }
    }
    out
}

/// The names in backticks of `cell` that name a module (not a path of files).
fn ticked(cell: &str) -> impl Iterator<Item = String> + '_ {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|n| !n.contains('/') && !n.contains('.'))
        .map(str::to_string)
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
            if module
                .last()
                .is_some_and(|m| m == "mod" || m == "lib" || m == "main")
            {
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

/// The rules of the module comment over `sources` of the crate in `src`, with each
/// module's `row` of its table: every breach, described.
fn breaches(src: &Path, rows: &BTreeMap<String, Row>, sources: &[Source]) -> Vec<String> {
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
            continue; // lib.rs or main.rs: the root
        };
        let Some(own) = rows.get(top) else {
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
                    "{}: `{shown}` goes through the crate root's re-exports: name the module that holds it",
                    s.file
                ));
                continue;
            }
            let named_len = (1..=abs.len())
                .take_while(|&k| is_module(src, &abs[..k]))
                .last()
                .unwrap_or(1);
            let named = abs[..named_len].to_vec();
            let Some(def) = defining(src, &bound, abs) else {
                continue;
            };
            let target = &def[0];
            if target != top {
                match rows.get(target) {
                    None => {
                        found.insert(format!("{}: `{target}` is in no row of the table", s.file));
                    }
                    Some(row) if !own.allows(target, row) => {
                        found.insert(format!(
                            "{}: `{shown}`: `{top}` (layer {}) may not import `{target}` (layer {})",
                            s.file, own.layer, row.layer
                        ));
                    }
                    Some(row) if row.layer == own.layer => {
                        same_layer.insert((top.clone(), target.clone()));
                    }
                    _ => {}
                }
                continue;
            }
            // a folder's re-export, read by a file inside the folder
            if def != named && s.module.starts_with(&named) && s.module != named {
                found.insert(format!(
                    "{}: `{shown}` goes through {}'s re-exports: name {} (the file that holds it)",
                    s.file,
                    named.join("/"),
                    def.join("/")
                ));
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

/// The crates the tables cover: the heading of each one's table, its sources, and its
/// root file.
const CRATES: [(&str, &str, &str); 3] = [
    ("## Layers and what each may import", "src", "lib.rs"),
    ("### The `qkv` binary", "../qkv-cli/src", "main.rs"),
    ("### The Python package", "../qkv-py/src", "lib.rs"),
];

/// Each crate's table, sources and root, read from the repository.
fn crates() -> Vec<(BTreeMap<String, Row>, PathBuf, Vec<Source>)> {
    let architecture = std::fs::read_to_string(crate_dir().join("../../ARCHITECTURE.md")).unwrap();
    CRATES
        .iter()
        .map(|&(heading, dir, root)| {
            let rows = layers(section(&architecture, heading));
            let src = crate_dir().join(dir);
            let all = sources(&src);
            // every module the root declares has a row
            let code = &all.iter().find(|s| s.file == root).unwrap().code;
            for line in code.lines() {
                let line = line
                    .trim()
                    .trim_start_matches("pub ")
                    .trim_start_matches("pub(crate) ");
                if let Some(name) = line.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                    assert!(
                        rows.contains_key(name),
                        "{dir}/{root} declares `{name}`, which no row of {heading:?} lists"
                    );
                }
            }
            (rows, src, all)
        })
        .collect()
}

#[test]
fn every_crate_keeps_its_table_of_layers() {
    for (rows, src, all) in crates() {
        assert!(
            rows.len() >= 5,
            "{}: too few modules: {rows:?}",
            src.display()
        );
        let found = breaches(&src, &rows, &all);
        assert!(
            found.is_empty(),
            "{}: {} breaches:\n{}",
            src.display(),
            found.len(),
            found.join("\n")
        );
    }
}

/// In each crate, an import planted into a file of its lowest row, of a module of its
/// highest row, is caught.
#[test]
fn a_planted_import_fails_in_each_crate() {
    for (rows, src, mut all) in crates() {
        let low = rows.values().map(|r| r.layer).min().unwrap();
        let high = rows.iter().max_by_key(|(_, r)| r.layer).unwrap().0.clone();
        let (lowest, _) = rows.iter().find(|(_, r)| r.layer == low).unwrap();
        let file = all
            .iter_mut()
            .find(|s| s.module.first() == Some(lowest))
            .unwrap();
        file.code
            .push_str(&format!("\nuse crate::{high}::Planted;\n"));
        let planted = file.file.clone();
        let found = breaches(&src, &rows, &all);
        assert!(
            found
                .iter()
                .any(|f| f.starts_with(&format!("{planted}: `crate::{high}::Planted`"))),
            "{}: the planted import in {planted} was not caught: {found:?}",
            src.display()
        );
    }
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
        "pub mod low;\npub mod side;\npub mod high;\npub mod kernels;\npub use low::Thing;\n",
    );
    write(
        "low.rs",
        "use crate::high::Model; // lower imports higher\nuse crate::side::Other; // a sibling the cell does not name\npub struct Thing;\n",
    );
    write("side.rs", "pub struct Other;\n");
    write(
        "high.rs",
        "use crate::Thing; /* through the facade */\nuse crate::low::{self, Thing as T};\n",
    );
    write(
        "kernels/mod.rs",
        "mod a;\nmod b;\nmod c;\npub struct Out;\npub use c::Sum;\n",
    );
    write("kernels/a.rs", "use super::Out;\nuse super::b::run;\n");
    write(
        "kernels/b.rs",
        "use super::a::{x, y::z};\nlet s = \"crate::high::Hidden\"; // a string\n",
    );
    write("kernels/c.rs", "pub struct Sum;\n");
    write(
        "kernels/d.rs",
        "use crate::kernels::Sum; // the folder's re-export\n",
    );
    let table = "| 0 | `low`, `side`, `kernels` | … | nothing |\n| 1 | `high` | … | layer 0 |\n";
    let found = breaches(&src, &layers(table), &sources(&src));
    let expect = [
        "low.rs: `crate::high::Model`: `low` (layer 0) may not import `high` (layer 1)",
        "low.rs: `crate::side::Other`: `low` (layer 0) may not import `side` (layer 0)",
        "high.rs: `crate::Thing` goes through the crate root's re-exports",
        "kernels/a.rs: `super::Out` is defined in kernels's mod.rs",
        "kernels/d.rs: `crate::kernels::Sum` goes through kernels's re-exports",
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
