//! Attribute macros for the hotloop runtime: `#[hotloop::main]` and
//! `#[hotloop::test]`. Use them through the `hotloop` crate (feature
//! `macros`, on by default), not from here.
//!
//! Both wrap an `async fn` in a synchronous one that builds a runtime and
//! runs the body with `Runtime::block_on`. The generated code names the
//! runtime as `::hotloop`, so the calling crate must depend on `hotloop`
//! under that name.
#![warn(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ItemFn, Lit, Meta, ReturnType, Token};

/// Runs an `async fn main` on a hotloop runtime.
///
/// ```ignore
/// #[hotloop::main(workers = 2, driver = "epoll")]
/// async fn main() -> std::io::Result<()> {
///     Ok(())
/// }
/// ```
///
/// Options: `workers = N` (default: one per core) and
/// `driver = "auto" | "epoll" | "uring"` (default `auto`, which the
/// `HOTLOOP_DRIVER` environment variable overrides). The body runs on the
/// calling thread through `Runtime::block_on`; `hotloop::spawn` inside it
/// spawns there too, and `Handle::current()` reaches the workers.
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, Kind::Main).unwrap_or_else(|e| e.to_compile_error()).into()
}

/// Runs an `async fn` test on a hotloop runtime (one worker by default).
///
/// ```ignore
/// #[hotloop::test(driver = "all")]
/// async fn echoes(driver: hotloop::DriverKind) {
///     // runs twice: as `echoes::epoll` and `echoes::uring`
/// }
/// ```
///
/// Options:
/// - `driver = "auto" | "epoll" | "uring" | "all"` (default `auto`).
///   `"all"` makes a module named after the test with one test per driver,
///   `epoll` and `uring`. A test on io_uring where the kernel cannot run
///   it, or where `HOTLOOP_DRIVER=epoll` forces epoll on every runtime,
///   prints why and passes without running, unless the environment
///   variable `HOTLOOP_REQUIRE_URING=1` is set: then it fails.
/// - `workers = N` (default 1).
/// - `start_paused = true` (default false): the body starts with time
///   paused on its worker (`hotloop::time::pause()`), so its timers move
///   only with `hotloop::time::advance` or when nothing else can run
///   (then the clock jumps to the next timer). Only for an `async fn`.
///
/// The test function may take one argument, the `hotloop::DriverKind` it
/// runs on. Other attributes (`#[should_panic]`, `#[ignore]`) are copied to
/// every generated test, and a `Result` return type is kept. On io_uring
/// the generated test checks a `#[should_panic]` itself (the panic must
/// come, with the expected message if one is given), so that a skip
/// passes as every skipped test does instead of failing with "did not
/// panic", and the `HOTLOOP_REQUIRE_URING=1` failure stays a failure
/// instead of passing as the expected panic.
///
/// With `driver = "all"` the test may also be a plain `fn` that takes the
/// driver, for a test that builds its own runtimes (several workers, a
/// server it stops, a runtime it drops mid-test). No runtime is made for
/// it: the body runs once per driver, with the same module names and the
/// same io_uring skip (and `HOTLOOP_REQUIRE_URING=1` failure) as above.
///
/// ```ignore
/// #[hotloop::test(driver = "all")]
/// fn serves_on_two_workers(driver: hotloop::DriverKind) {
///     let rt = hotloop::Runtime::builder().workers(2).driver(driver).build().unwrap();
///     // ...
/// }
/// ```
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, Kind::Test).unwrap_or_else(|e| e.to_compile_error()).into()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Main,
    Test,
}

#[derive(Clone, Copy, PartialEq)]
enum Driver {
    Auto,
    Epoll,
    Uring,
    All,
}

struct Options {
    driver: Driver,
    workers: Option<TokenStream2>,
    /// `start_paused = true`, and where it was written.
    start_paused: Option<Span>,
}

fn parse_options(args: TokenStream, kind: Kind) -> syn::Result<Options> {
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse(args)?;
    let mut options = Options { driver: Driver::Auto, workers: None, start_paused: None };
    for meta in metas {
        let Meta::NameValue(nv) = &meta else {
            return Err(syn::Error::new_spanned(
                meta,
                "expected `driver = \"...\"`, `workers = N` or `start_paused = true`",
            ));
        };
        let name = nv.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
        match name.as_str() {
            "driver" => {
                let Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) = &nv.value else {
                    return Err(syn::Error::new_spanned(&nv.value, "`driver` takes a string"));
                };
                options.driver = match (s.value().as_str(), kind) {
                    ("auto", _) => Driver::Auto,
                    ("epoll", _) => Driver::Epoll,
                    ("uring" | "io_uring", _) => Driver::Uring,
                    ("all", Kind::Test) => Driver::All,
                    _ => {
                        let expected = match kind {
                            Kind::Test => "\"auto\", \"epoll\", \"uring\" or \"all\"",
                            Kind::Main => "\"auto\", \"epoll\" or \"uring\"",
                        };
                        return Err(syn::Error::new_spanned(
                            s,
                            format!("unknown driver: expected {expected}"),
                        ));
                    }
                };
            }
            "workers" => {
                let Expr::Lit(ExprLit { lit: Lit::Int(n), .. }) = &nv.value else {
                    return Err(syn::Error::new_spanned(&nv.value, "`workers` takes a number"));
                };
                let n: usize = n.base10_parse()?;
                if n == 0 {
                    return Err(syn::Error::new_spanned(&nv.value, "`workers` must be at least 1"));
                }
                options.workers = Some(quote!(#n));
            }
            "start_paused" if kind == Kind::Test => {
                let Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) = &nv.value else {
                    return Err(syn::Error::new_spanned(&nv.value, "`start_paused` takes a bool"));
                };
                options.start_paused = b.value.then_some(b.span);
            }
            _ => {
                let expected = match kind {
                    Kind::Test => "`driver`, `workers` or `start_paused`",
                    Kind::Main => "`driver` or `workers`",
                };
                return Err(syn::Error::new_spanned(
                    &nv.path,
                    format!("unknown option: expected {expected}"),
                ));
            }
        }
    }
    Ok(options)
}

fn expand(args: TokenStream, item: TokenStream, kind: Kind) -> syn::Result<TokenStream2> {
    let options = parse_options(args, kind)?;
    let input: ItemFn = syn::parse(item)?;
    let is_async = input.sig.asyncness.is_some();
    if !is_async {
        // A plain test builds its own runtimes: it only needs the driver matrix.
        let plain_test_fits =
            kind == Kind::Test && options.driver == Driver::All && input.sig.inputs.len() == 1;
        if !plain_test_fits {
            let msg = match kind {
                Kind::Test => {
                    "the function must be `async fn`, or a plain `fn name(driver: hotloop::DriverKind)` with `driver = \"all\"`"
                }
                Kind::Main => "the function must be `async fn`",
            };
            return Err(syn::Error::new_spanned(input.sig.fn_token, msg));
        }
        if let Some(workers) = &options.workers {
            return Err(syn::Error::new_spanned(
                workers,
                "`workers` sets the runtime an `async fn` test runs on; a plain `fn` test builds its own",
            ));
        }
        if let Some(span) = options.start_paused {
            return Err(syn::Error::new(
                span,
                "`start_paused` pauses the runtime an `async fn` test runs on; a plain `fn` test builds its own (call `hotloop::time::pause()` there)",
            ));
        }
    }
    let takes_driver = match input.sig.inputs.len() {
        0 => false,
        1 if kind == Kind::Test => true,
        _ => {
            let msg = match kind {
                Kind::Test => {
                    "a hotloop test takes no argument, or one: the `DriverKind` it runs on"
                }
                Kind::Main => "`main` takes no arguments",
            };
            return Err(syn::Error::new_spanned(&input.sig.inputs, msg));
        }
    };
    match kind {
        Kind::Main => Ok(expand_main(input, &options)),
        Kind::Test => expand_test(input, &options, takes_driver, is_async),
    }
}

/// What a `#[should_panic]` asks of a test: `Some(expected)`, the message
/// it names if any, or `None` for an attribute that is not one.
fn should_panic(attr: &syn::Attribute) -> syn::Result<Option<Option<syn::LitStr>>> {
    if !attr.path().is_ident("should_panic") {
        return Ok(None);
    }
    let expected = match &attr.meta {
        Meta::Path(_) => None,
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Some(s.clone()),
            other => return Err(syn::Error::new_spanned(other, "expected a string")),
        },
        Meta::List(list) => {
            let mut expected = None;
            list.parse_nested_meta(|m| {
                if m.path.is_ident("expected") {
                    expected = Some(m.value()?.parse::<syn::LitStr>()?);
                    Ok(())
                } else {
                    Err(m.error("expected `expected = \"...\"`"))
                }
            })?;
            expected
        }
    };
    Ok(Some(expected))
}

fn driver_path(driver: Driver) -> TokenStream2 {
    match driver {
        Driver::Epoll => quote!(::hotloop::DriverKind::Epoll),
        Driver::Uring => quote!(::hotloop::DriverKind::Uring),
        Driver::Auto | Driver::All => quote!(::hotloop::DriverKind::Auto),
    }
}

fn expand_main(input: ItemFn, options: &Options) -> TokenStream2 {
    let ItemFn { attrs, vis, sig, block } = input;
    let name = &sig.ident;
    let output = &sig.output;
    let workers = options.workers.as_ref().map(|n| quote!(.workers(#n)));
    let driver = driver_path(options.driver);
    quote! {
        #(#attrs)*
        #vis fn #name() #output {
            let runtime = ::hotloop::Runtime::builder()
                #workers
                .driver(#driver)
                .build()
                .expect("could not start the hotloop runtime");
            runtime.block_on(async move #block)
        }
    }
}

fn expand_test(
    input: ItemFn,
    options: &Options,
    takes_driver: bool,
    is_async: bool,
) -> syn::Result<TokenStream2> {
    let ItemFn { attrs, vis, sig, block } = input;
    let name = &sig.ident;
    let output = &sig.output;
    // A `#[should_panic]` is left to the test harness on epoll, and checked
    // by the generated test on io_uring (see `one` below).
    let mut panic_check = None;
    let mut other_attrs = Vec::new();
    for attr in &attrs {
        match should_panic(attr)? {
            Some(expected) => panic_check = Some(expected),
            None => other_attrs.push(attr),
        }
    }
    if let (Some(_), ReturnType::Type(..)) = (&panic_check, output) {
        return Err(syn::Error::new_spanned(output, "a `#[should_panic]` test must return `()`"));
    }
    let workers = options.workers.clone().unwrap_or_else(|| quote!(1usize));
    let body_fn = format_ident!("__hotloop_test_body", span = Span::call_site());
    let call = if takes_driver { quote!(#body_fn(driver)) } else { quote!(#body_fn()) };
    // The body stays an `async fn` of its own, so `?` and `return` in it
    // mean what they say.
    let body = {
        let mut sig = sig.clone();
        sig.ident = body_fn.clone();
        quote!(#sig #block)
    };
    // An `async fn` runs on a runtime built here; a plain `fn` is called as it is.
    let call = if options.start_paused.is_some() {
        quote!(async {
            ::hotloop::time::pause();
            #call.await
        })
    } else {
        call
    };
    // The runtime is built before the body runs, apart from it: a
    // `#[should_panic]` body's panic is checked on its own, so a runtime
    // that cannot start fails the test rather than pass as the panic.
    let (build, run) = if is_async {
        let build = quote! {
            let runtime = ::hotloop::Runtime::builder()
                .workers(#workers)
                .driver(driver)
                .build()
                .expect("could not start the hotloop runtime");
        };
        (build, quote!(runtime.block_on(#call)))
    } else {
        (quote!(), quote!(#call))
    };
    let skip_return = match output {
        ReturnType::Default => quote!(return;),
        ReturnType::Type(..) => quote!(return ::core::result::Result::Ok(());),
    };
    // One `#[test]` on `driver`; `inner` is placed inside its block (the
    // body, for a single test, so that tests in one module do not clash).
    //
    // On io_uring a `#[should_panic]` is not passed on: the harness would
    // count the skip (a return) as "did not panic", and the
    // `HOTLOOP_REQUIRE_URING=1` failure (a panic) as the panic expected.
    // The body's panic is checked inside instead, after the skip.
    let one = |driver: Driver, test_name: &syn::Ident, inner: Option<&TokenStream2>| {
        let kind = driver_path(driver);
        let skip = (driver == Driver::Uring).then(|| {
            quote! {
                if ::hotloop::__private::skip_uring_test() {
                    #skip_return
                }
            }
        });
        let (attrs, run) = match &panic_check {
            Some(expected) if driver == Driver::Uring => {
                let expected = match expected {
                    Some(msg) => quote!(::core::option::Option::Some(#msg)),
                    None => quote!(::core::option::Option::None),
                };
                let run = quote! {
                    ::hotloop::__private::expect_panic(#expected, move || { #run });
                };
                (quote!(#(#other_attrs)*), run)
            }
            _ => (quote!(#(#attrs)*), run.clone()),
        };
        quote! {
            #[::core::prelude::v1::test]
            #attrs
            fn #test_name() #output {
                #inner
                #skip
                let driver: ::hotloop::DriverKind = #kind;
                #build
                #run
            }
        }
    };
    match options.driver {
        Driver::All => {
            let epoll = one(Driver::Epoll, &format_ident!("epoll"), None);
            let uring = one(Driver::Uring, &format_ident!("uring"), None);
            Ok(quote! {
                #vis mod #name {
                    #[allow(unused_imports)]
                    use super::*;

                    #body
                    #epoll
                    #uring
                }
            })
        }
        driver => Ok(one(driver, name, Some(&body))),
    }
}
