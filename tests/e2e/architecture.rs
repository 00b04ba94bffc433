//! The workspace's shape, checked: no production function over 120 lines (`Runner::run` under
//! 100), and no import circle between the modules of any crate. Sources are parsed with `syn`;
//! test code (`#[cfg(test)]` items and modules) is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::harness::workspace;

/// The longest a production function may be, in lines.
const MAX_FUNCTION_LINES: usize = 120;
/// The longest `Runner::run` may be: it reads as the run's table of contents.
const MAX_RUNNER_RUN_LINES: usize = 100;

/// One module of a crate: its path from the crate root and its file.
struct Module {
    path: Vec<String>,
    file: PathBuf,
    ast: syn::File,
}

/// Every crate of the workspace with production code: its name and root file.
fn crate_roots() -> Vec<(String, PathBuf)> {
    let root = workspace();
    let mut roots = Vec::new();
    for dir in ["crates", "plugins"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            for file in ["src/lib.rs", "src/main.rs"] {
                let path = entry.path().join(file);
                if path.is_file() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    roots.push((format!("{name} ({file})"), path));
                }
            }
        }
    }
    roots.sort();
    assert!(roots.len() >= 15, "too few crates found: {roots:?}");
    roots
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The production modules of the crate rooted at `root` (its file modules and inline ones).
fn modules(root: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![(Vec::new(), root.to_path_buf())];
    while let Some((path, file)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // Children of `a/b.rs` (or `a/b/mod.rs`) live in `a/b/`; of `lib.rs`, `main.rs` and
        // `mod.rs`, next to them.
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = if path.is_empty() || stem == "mod" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.parent().unwrap().join(&stem)
        };
        for item in &ast.items {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
                && !is_test_only(&m.attrs)
            {
                let name = m.ident.to_string();
                let flat = dir.join(format!("{name}.rs"));
                let child = if flat.is_file() {
                    flat
                } else {
                    dir.join(&name).join("mod.rs")
                };
                let mut child_path = path.clone();
                child_path.push(name);
                todo.push((child_path, child));
            }
        }
        out.push(Module { path, file, ast });
    }
    out
}

/// Every function of a module with its length, test code left out.
#[derive(Default)]
struct Functions {
    found: Vec<(String, usize, usize)>,
    impl_of: Vec<String>,
}

impl Functions {
    fn add(&mut self, name: String, block: &syn::Block, sig: &syn::Signature) {
        use syn::spanned::Spanned as _;
        let start = sig.span().start().line;
        let end = block.span().end().line;
        let qualified = match self.impl_of.last() {
            Some(ty) => format!("{ty}::{name}"),
            None => name,
        };
        self.found.push((qualified, start, end + 1 - start));
    }
}

impl<'a> Visit<'a> for Functions {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        if is_test_only(&i.attrs) {
            return;
        }
        let ty = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        self.impl_of.push(ty.unwrap_or_else(|| "_".into()));
        syn::visit::visit_item_impl(self, i);
        self.impl_of.pop();
    }

    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            self.add(f.sig.ident.to_string(), &f.block, &f.sig);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            self.add(f.sig.ident.to_string(), &f.block, &f.sig);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(block) = &f.default
            && !is_test_only(&f.attrs)
        {
            self.add(f.sig.ident.to_string(), block, &f.sig);
        }
    }
}

/// Every production function of the workspace: (file, name, first line, length).
fn functions() -> Vec<(PathBuf, String, usize, usize)> {
    let mut all = Vec::new();
    for (_, root) in crate_roots() {
        for m in modules(&root) {
            let mut v = Functions::default();
            v.visit_file(&m.ast);
            for (name, line, len) in v.found {
                all.push((m.file.clone(), name, line, len));
            }
        }
    }
    all
}

#[test]
fn no_production_function_is_over_120_lines() {
    let all = functions();
    assert!(all.len() > 500, "too few functions found: {}", all.len());
    let root = workspace();
    let long: Vec<String> = all
        .iter()
        .filter(|(_, _, _, len)| *len > MAX_FUNCTION_LINES)
        .map(|(file, name, line, len)| {
            let file = file.strip_prefix(&root).unwrap_or(file).display();
            format!("{file}:{line} `{name}` is {len} lines")
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them by what they do):\n{}",
        long.join("\n")
    );
}

#[test]
fn runner_run_reads_as_a_table_of_contents() {
    let all = functions();
    let run = all
        .iter()
        .find(|(file, name, _, _)| file.ends_with("runner/src/engine.rs") && name == "Runner::run")
        .expect("Runner::run not found in crates/runner/src/engine.rs");
    assert!(
        run.3 < MAX_RUNNER_RUN_LINES,
        "Runner::run is {} lines; keep it under {MAX_RUNNER_RUN_LINES}",
        run.3
    );
}

/// The module paths a module's production code names through `crate::`, `super::` or
/// `self::` (in `use` declarations and in paths), resolved against the module's own path.
#[derive(Default)]
struct Uses {
    here: Vec<String>,
    named: BTreeSet<Vec<String>>,
}

impl Uses {
    /// Resolves a path's leading segments to an absolute module path, if it is crate-local.
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut out = match segments.first()?.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => self.here.clone(),
            _ => return None,
        };
        let mut rest = &segments[1..];
        if segments[0] == "super" {
            out.pop();
            while rest.first().is_some_and(|s| s == "super") {
                out.pop();
                rest = &rest[1..];
            }
        }
        out.extend(rest.iter().cloned());
        Some(out)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                full.push(n.ident.to_string());
                self.add(&full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.add(&full);
            }
            syn::UseTree::Glob(_) => self.add(prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn add(&mut self, segments: &[String]) {
        if let Some(p) = self.resolve(segments) {
            self.named.insert(p);
        }
    }
}

impl<'a> Visit<'a> for Uses {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        if !is_test_only(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        if !is_test_only(&u.attrs) {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'a syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.add(&segments);
        syn::visit::visit_path(self, p);
    }
}

/// The file-to-file import graph of one crate: an edge from each module to every other
/// module whose items it names. The crate root is left out: it only declares modules and
/// re-exports them.
fn import_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(root);
    let known: BTreeSet<Vec<String>> = modules.iter().map(|m| m.path.clone()).collect();
    let mut graph = BTreeMap::new();
    for m in modules.iter().filter(|m| !m.path.is_empty()) {
        let mut uses = Uses {
            here: m.path.clone(),
            ..Uses::default()
        };
        uses.visit_file(&m.ast);
        let targets: BTreeSet<String> = uses
            .named
            .iter()
            .filter_map(|p| {
                // The longest prefix that is a module: the module the item lives in.
                (1..=p.len())
                    .rev()
                    .map(|n| p[..n].to_vec())
                    .find(|prefix| known.contains(prefix))
            })
            .filter(|target| !target.is_empty() && *target != m.path)
            .map(|t| t.join("::"))
            .collect();
        graph.insert(m.path.join("::"), targets);
    }
    graph
}

/// A circle in `graph`, if there is one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut circle = stack[at..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node).copied().unwrap_or(0) == 0
            && let Some(c) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let mut circles = Vec::new();
    let mut edges = 0;
    for (name, root) in crate_roots() {
        let graph = import_graph(&root);
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        if let Some(c) = find_circle(&graph) {
            circles.push(format!("{name}: {}", c.join(" → ")));
        }
    }
    assert!(
        edges > 50,
        "too few imports found ({edges}): is the parser seeing the code?"
    );
    assert!(
        circles.is_empty(),
        "import circles (move what both sides need into a module of its own):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_finder_finds_a_circle_and_only_a_circle() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry((*a).into()).or_default().insert((*b).into());
            g.entry((*b).into()).or_default();
        }
        g
    };
    let circle = find_circle(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
    assert_eq!(
        circle,
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        find_circle(&graph(&[("a", "b"), ("a", "c"), ("b", "c")])),
        None
    );
}

#[test]
fn the_import_graph_sees_use_paths_and_super() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::X;\npub struct Y;\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct X;\nfn f() -> super::c::Z { todo!() }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub struct Z;\n#[cfg(test)]\nmod tests { use crate::a::Y; }\nfn g(_: crate::a::Y) {}\n",
    )
    .unwrap();
    let graph = import_graph(&src.join("lib.rs"));
    assert_eq!(graph["a"], BTreeSet::from(["b".to_owned()]));
    assert_eq!(graph["b"], BTreeSet::from(["c".to_owned()]));
    assert_eq!(graph["c"], BTreeSet::from(["a".to_owned()]));
    assert!(find_circle(&graph).is_some());
}

/// The error types the libraries declare (`thiserror::Error` derives on public types).
fn library_error_types() -> BTreeMap<String, PathBuf> {
    #[derive(Default)]
    struct Errors(Vec<String>);
    impl<'a> Visit<'a> for Errors {
        fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
            if !is_test_only(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_enum(&mut self, e: &'a syn::ItemEnum) {
            if derives_error(&e.attrs) && matches!(e.vis, syn::Visibility::Public(_)) {
                self.0.push(e.ident.to_string());
            }
        }
        fn visit_item_struct(&mut self, s: &'a syn::ItemStruct) {
            if derives_error(&s.attrs) && matches!(s.vis, syn::Visibility::Public(_)) {
                self.0.push(s.ident.to_string());
            }
        }
    }
    fn derives_error(attrs: &[syn::Attribute]) -> bool {
        attrs.iter().any(|a| {
            a.path().is_ident("derive")
                && a.meta
                    .require_list()
                    .is_ok_and(|l| l.tokens.to_string().contains("Error"))
        })
    }
    let mut found = BTreeMap::new();
    for (name, root) in crate_roots() {
        // The CLI's own errors, the benchmarks and the test model server are not libraries.
        if ["cli", "bench", "modelserver"]
            .iter()
            .any(|c| name.starts_with(&format!("{c} ")))
        {
            continue;
        }
        for m in modules(&root) {
            let mut v = Errors::default();
            v.visit_file(&m.ast);
            for e in v.0 {
                found.insert(e, m.file.clone());
            }
        }
    }
    found
}

/// The error types `crates/cli/src/exit.rs` gives a code (`Known`'s variants) and the ones it
/// says never reach the CLI.
fn classified_error_types() -> (BTreeSet<String>, BTreeSet<String>) {
    let path = workspace().join("crates/cli/src/exit.rs");
    let ast = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut known = BTreeSet::new();
    let mut never = BTreeSet::new();
    for item in &ast.items {
        match item {
            syn::Item::Enum(e) if e.ident == "Known" => {
                for v in &e.variants {
                    for f in &v.fields {
                        if let syn::Type::Reference(r) = &f.ty
                            && let syn::Type::Path(p) = &*r.elem
                        {
                            known.insert(p.path.segments.last().unwrap().ident.to_string());
                        }
                    }
                }
            }
            syn::Item::Const(c) if c.ident == "NEVER_AN_ERROR_OF_THE_CLI" => {
                let syn::Expr::Reference(r) = &*c.expr else {
                    panic!("NEVER_AN_ERROR_OF_THE_CLI is not a slice")
                };
                let syn::Expr::Array(pairs) = &*r.expr else {
                    panic!("NEVER_AN_ERROR_OF_THE_CLI is not a slice")
                };
                for pair in &pairs.elems {
                    if let syn::Expr::Tuple(t) = pair
                        && let Some(syn::Expr::Lit(lit)) = t.elems.first()
                        && let syn::Lit::Str(name) = &lit.lit
                    {
                        never.insert(name.value());
                    }
                }
            }
            _ => {}
        }
    }
    (known, never)
}

#[test]
fn every_library_error_type_has_an_exit_code() {
    let declared = library_error_types();
    let (known, never) = classified_error_types();
    assert!(
        known.len() >= 10 && declared.len() >= 10,
        "{known:?} {declared:?}"
    );
    let missing: Vec<String> = declared
        .iter()
        .filter(|(name, _)| !known.contains(*name) && !never.contains(*name))
        .map(|(name, file)| format!("{name} ({})", file.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "error types with no exit code: give each a variant of `Known` in \
         crates/cli/src/exit.rs (or say in NEVER_AN_ERROR_OF_THE_CLI why it never reaches the \
         CLI):\n{}",
        missing.join("\n")
    );
    let stale: Vec<&String> = never
        .iter()
        .filter(|n| !declared.contains_key(*n))
        .collect();
    assert!(stale.is_empty(), "no longer declared: {stale:?}");
}
