//! The shape rule of the production code: no function over
//! [`FN_LINES_MAX`] code lines and no file over [`FILE_LINES_MAX`].
//!
//! A code line is a line that holds at least one token of Rust: blank lines
//! and comments (doc comments included) do not count. Items marked
//! `#[cfg(test)]` do not count at all, nor does anything inside them.
//!
//! Invariant: the checker reads source text only; it never builds or runs
//! the code it counts.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use proc_macro2::{TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The most code lines one production function may have.
pub const FN_LINES_MAX: usize = 70;
/// The most code lines one production source file may have.
pub const FILE_LINES_MAX: usize = 800;

/// One function's name, first line and code lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnShape {
    pub name: String,
    pub line: usize,
    pub code_lines: usize,
}

/// A file's code lines outside test items, and its functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileShape {
    pub code_lines: usize,
    pub functions: Vec<FnShape>,
}

/// Why a file could not be counted.
#[derive(Debug)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// Counts one file's source text.
pub fn measure(source: &str) -> Result<FileShape, ParseError> {
    let tokens: TokenStream = source
        .parse()
        .map_err(|e: proc_macro2::LexError| ParseError(format!("{e:?}")))?;
    let mut code = BTreeSet::new();
    collect_code_lines(source, tokens, &mut code);
    let file = syn::parse_file(source).map_err(|e| {
        let at = e.span().start();
        ParseError(format!("{}:{}: {e}", at.line, at.column + 1))
    })?;
    let mut visitor = Items::default();
    visitor.visit_file(&file);
    for test in &visitor.tests {
        code.retain(|line| !test.contains(line));
    }
    let functions = visitor
        .functions
        .into_iter()
        .filter(|(_, span)| !visitor.tests.iter().any(|t| t.contains(span.start())))
        .map(|(name, span)| FnShape {
            line: *span.start(),
            code_lines: code.range(span).count(),
            name,
        })
        .collect();
    let code_lines = code.len();
    Ok(FileShape {
        code_lines,
        functions,
    })
}

/// Adds every line that holds a token, skipping doc comments, which the
/// lexer turns into `#[doc = ...]` attributes spanning the comment.
fn collect_code_lines(source: &str, tokens: TokenStream, code: &mut BTreeSet<usize>) {
    let mut tokens = tokens.into_iter().peekable();
    while let Some(token) = tokens.next() {
        if let TokenTree::Punct(p) = &token {
            if p.as_char() == '#' && is_comment(source, &token) {
                tokens.next_if(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == '!'));
                tokens.next_if(|t| matches!(t, TokenTree::Group(_)));
                continue;
            }
        }
        match token {
            TokenTree::Group(group) => {
                add_line(code, group.span_open().start().line);
                add_line(code, group.span_close().start().line);
                collect_code_lines(source, group.stream(), code);
            }
            other => {
                let span = other.span();
                for line in span.start().line..=span.end().line {
                    add_line(code, line);
                }
            }
        }
    }
}

fn add_line(code: &mut BTreeSet<usize>, line: usize) {
    code.insert(line);
}

/// Whether a `#` token starts a doc comment rather than an attribute: its
/// span then covers text that begins with `//` or `/*`.
fn is_comment(source: &str, token: &TokenTree) -> bool {
    let range = token.span().byte_range();
    source
        .get(range.start..)
        .is_some_and(|rest| rest.starts_with("//") || rest.starts_with("/*"))
}

#[derive(Default)]
struct Items {
    functions: Vec<(String, RangeInclusive<usize>)>,
    tests: Vec<RangeInclusive<usize>>,
}

impl Items {
    /// Records a test item and reports whether the walk stops there.
    fn skip_test(&mut self, attrs: &[syn::Attribute], span: proc_macro2::Span) -> bool {
        if attrs.iter().any(is_cfg_test) {
            self.tests.push(span.start().line..=span.end().line);
            return true;
        }
        false
    }

    /// Walks into `node` with `walk` unless `attrs` make it a test item.
    fn walk_unless_test<'ast, N: Spanned>(
        &mut self,
        attrs: &[syn::Attribute],
        node: &'ast N,
        walk: fn(&mut Self, &'ast N),
    ) {
        if !self.skip_test(attrs, node.span()) {
            walk(self, node);
        }
    }

    fn function(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        self.functions
            .push((name.to_string(), span.start().line..=span.end().line));
    }
}

fn is_cfg_test(attr: &syn::Attribute) -> bool {
    if !attr.path().is_ident("cfg") {
        return false;
    }
    let mut test = false;
    let _ = attr.parse_nested_meta(|meta| {
        test |= meta.path.is_ident("test");
        Ok(())
    });
    test
}

impl<'ast> Visit<'ast> for Items {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        self.walk_unless_test(item_attrs(item), item, syn::visit::visit_item);
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.function(&item.sig.ident, item.span());
        syn::visit::visit_item_fn(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = impl_item_attrs(item);
        self.walk_unless_test(attrs, item, syn::visit::visit_impl_item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.function(&item.sig.ident, item.span());
        syn::visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if item.default.is_some() && !self.skip_test(&item.attrs, item.span()) {
            self.function(&item.sig.ident, item.span());
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn impl_item_attrs(item: &syn::ImplItem) -> &[syn::Attribute] {
    match item {
        syn::ImplItem::Fn(f) => &f.attrs,
        syn::ImplItem::Const(c) => &c.attrs,
        syn::ImplItem::Type(t) => &t.attrs,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(source: &str) -> FileShape {
        measure(source).expect("parses")
    }

    #[test]
    fn blank_lines_and_comments_are_not_code() {
        let cases: &[(&str, usize)] = &[
            ("fn a() {}\n", 1),
            ("\n\nfn a() {\n\n}\n", 2),
            ("// one\n/* two\nthree */\nfn a() {}\n", 1),
            ("/// doc\n/// more\nfn a() {}\n", 1),
            ("//! inner doc\nfn a() {}\n", 1),
            ("#[inline]\nfn a() {}\n", 2),
            ("fn a() -> &'static str {\n    \"x\n//y\n\"\n}\n", 5),
        ];
        for (source, lines) in cases {
            assert_eq!(shape(source).code_lines, *lines, "{source:?}");
        }
    }

    #[test]
    fn test_items_are_left_out_of_files_and_functions() {
        let source = "fn a() {\n    1;\n}\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
        let shape = shape(source);
        assert_eq!(shape.code_lines, 3);
        let names: Vec<_> = shape.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a"]);
        let method = "struct S;\nimpl S {\n    #[cfg(test)]\n    fn t() {}\n    fn m() {}\n}\n";
        let names: Vec<_> = measure(method)
            .unwrap()
            .functions
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["m"]);
    }

    #[test]
    fn a_function_counts_its_signature_body_and_attributes_but_no_comments() {
        let source =
            "/// doc\n#[must_use]\nfn long(\n    x: u8,\n) -> u8 {\n    // why\n\n    x\n}\n";
        let f = &shape(source).functions[0];
        assert_eq!((f.name.as_str(), f.line, f.code_lines), ("long", 1, 6));
    }

    #[test]
    fn methods_and_default_trait_methods_are_functions() {
        let source = "trait T {\n    fn d(&self) {}\n    fn r(&self);\n}\nimpl T for () {\n    fn r(&self) {}\n}\n";
        let names: Vec<_> = shape(source)
            .functions
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["d", "r"]);
    }

    #[test]
    fn source_that_does_not_parse_is_an_error() {
        assert!(measure("fn (").is_err());
        assert!(measure("\"open").is_err());
    }
}
