//! ValkeyImage admission: the version floor, and no in-place change or deletion while a config
//! references the image (register a new image and repoint the config instead).

use kube::core::admission::Operation;

use super::version::check_floor;
use super::{Review, Verdict, plural, some_of};
use crate::api::ValkeyImage;
use crate::api::bounds::image_problems;
use crate::fleet::Fleet;

pub fn validate_image(review: &Review<ValkeyImage>, fleet: &Fleet) -> Verdict {
    let mut verdict = Verdict::default();
    let users: Vec<&String> = fleet.configs_using_image(review.name).collect();
    let used_by = || {
        format!(
            "{} ({})",
            plural(users.len(), "ValkeyConfig"),
            some_of(&users, 5)
        )
    };
    match review.operation {
        Operation::Create | Operation::Update => {
            let Some(image) = review.object else {
                verdict.deny("the request carries no ValkeyImage object");
                return verdict;
            };
            for problem in image_problems(&image.spec) {
                verdict.deny(problem.to_string());
            }
            if let Err(problem) = check_floor(&image.spec.version) {
                verdict.deny(format!("spec.version {problem}"));
            }
            let changed = review.old.is_some_and(|old| old.spec != image.spec);
            if changed && !users.is_empty() {
                verdict.deny(format!(
                    "spec: ValkeyImage {} is used by {}, so its spec cannot change in place (that would silently roll every cluster behind them). \
                     Register a new ValkeyImage with the new repository/tag/version and repoint the configs' spec.imageRef at it",
                    review.name,
                    used_by()
                ));
            }
        }
        Operation::Delete => {
            if !users.is_empty() {
                verdict.deny(format!(
                    "ValkeyImage {} cannot be deleted while {} use it; repoint their spec.imageRef at another image first",
                    review.name,
                    used_by()
                ));
            }
        }
        Operation::Connect => {}
    }
    verdict
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
