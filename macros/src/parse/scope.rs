//! Name resolution while parsing a kernel body: which names are bound where, and which variables
//! each open `for` or `if` (a statement or a value) must carry because its body assigns them.

use syn::Ident;

/// What a name in a kernel body is bound to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BindingKind {
    /// A type parameter: usable only where a dtype is expected.
    DTypeParam,
    /// A `const` generic parameter.
    ConstParam,
    Argument {
        mutable: bool,
    },
    Local {
        mutable: bool,
    },
    LoopVariable,
}

struct Binding {
    name: String,
    kind: BindingKind,
}

/// A `for` or `if` (a statement or a value) whose body is being parsed.
struct OpenRegion {
    /// Bindings on scope levels below this one are declared outside the region.
    first_level: usize,
    carried: Vec<Ident>,
}

/// A stack of lexical scopes, innermost last, and the regions open around the current statement.
pub(crate) struct Scopes {
    levels: Vec<Vec<Binding>>,
    regions: Vec<OpenRegion>,
}

impl Scopes {
    pub(crate) fn new() -> Scopes {
        Scopes {
            levels: vec![Vec::new()],
            regions: Vec::new(),
        }
    }

    pub(crate) fn push_level(&mut self) {
        self.levels.push(Vec::new());
    }

    pub(crate) fn pop_level(&mut self) {
        self.levels
            .pop()
            .expect("levels are pushed and popped in pairs");
    }

    pub(crate) fn bind(&mut self, name: &Ident, kind: BindingKind) {
        self.levels
            .last_mut()
            .expect("the outermost level is never popped")
            .push(Binding {
                name: name.to_string(),
                kind,
            });
    }

    /// The innermost binding of `name` and the level it is on.
    fn find(&self, name: &str) -> Option<(usize, BindingKind)> {
        self.levels
            .iter()
            .enumerate()
            .rev()
            .find_map(|(level, bindings)| {
                let binding = bindings.iter().rev().find(|b| b.name == name)?;
                Some((level, binding.kind))
            })
    }

    pub(crate) fn lookup(&self, name: &Ident) -> Option<BindingKind> {
        self.find(&name.to_string()).map(|(_, kind)| kind)
    }

    /// Opens a region whose body starts a new scope level (call before `push_level`).
    pub(crate) fn open_region(&mut self) {
        self.regions.push(OpenRegion {
            first_level: self.levels.len(),
            carried: Vec::new(),
        });
    }

    /// Closes the innermost region and returns the variables it carries.
    pub(crate) fn close_region(&mut self) -> Vec<Ident> {
        self.regions
            .pop()
            .expect("regions are opened and closed in pairs")
            .carried
    }

    /// Records an assignment to `name`, already resolved to a mutable variable: every open region
    /// declared inside that variable's scope carries it.
    pub(crate) fn record_assignment(&mut self, name: &Ident) {
        let (level, _) = self
            .find(&name.to_string())
            .expect("the caller resolved the name");
        for region in &mut self.regions {
            if region.first_level > level && !region.carried.iter().any(|c| c == name) {
                region.carried.push(name.clone());
            }
        }
    }
}
