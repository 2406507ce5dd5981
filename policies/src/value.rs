//! Pre-built CEL values of the inputs. Building a value costs more than evaluating an
//! expression on it (REFERENCE-NOTES Part F), so the broker builds a [`HostValue`] once per
//! host report and a [`JobValue`] once per job change, and every evaluation borrows them.

use cel::common::value::Val;
use serde::Serialize;

use crate::facts::{HostFacts, JobFacts, LabFacts, NowFacts, UserFacts};

/// A CEL value built once from one of the fact structs.
pub struct Prebuilt(Box<dyn Val>);

impl std::fmt::Debug for Prebuilt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Prebuilt {
    fn build(facts: &impl Serialize) -> Prebuilt {
        // Conversion of our own structs: strings, i64, f64, bools, options, lists and string
        // keyed maps only, all of which CEL represents; a failure would be a bug here.
        let value = cel::to_value(facts).expect("fact structs hold only CEL-representable fields");
        let val: Box<dyn Val> = value
            .try_into()
            .expect("a serialized fact struct converts to a CEL value");
        Prebuilt(val)
    }

    pub(crate) fn val(&self) -> &dyn Val {
        self.0.as_ref()
    }
}

macro_rules! prebuilt {
    ($(#[$doc:meta])* $name:ident, $facts:ty) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(pub(crate) Prebuilt);

        impl $name {
            pub fn new(facts: &$facts) -> Self {
                $name(Prebuilt::build(facts))
            }
        }
    };
}

prebuilt!(
    /// `host`, built from [`HostFacts`] when its report arrives.
    HostValue,
    HostFacts
);
prebuilt!(
    /// `job` or `holder`, built from [`JobFacts`].
    JobValue,
    JobFacts
);
prebuilt!(
    /// `user`, built from [`UserFacts`].
    UserValue,
    UserFacts
);
prebuilt!(
    /// `lab`, built from [`LabFacts`].
    LabValue,
    LabFacts
);
prebuilt!(
    /// `now`, built from [`NowFacts`] once per decision round.
    NowValue,
    NowFacts
);
