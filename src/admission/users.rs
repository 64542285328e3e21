//! The ACL users a ValkeyCluster's or a ValkeyConfig's `spec.acl` lists: each name once, none of
//! the operator's; a role that does not exist yet only warns (the user waits for it). Shared by
//! both kinds' validators; what only one kind forbids stays in its file.

use std::collections::BTreeSet;

use super::{Verdict, clip};
use crate::acl;
use crate::api::AclUser;
use crate::fleet::Fleet;

/// Each user once, never `default` or one of the operator's; missing roles warned of.
pub fn check_users(users: &[AclUser], fleet: &Fleet, verdict: &mut Verdict) {
    let mut usernames = BTreeSet::new();
    for (index, user) in users.iter().enumerate() {
        if !usernames.insert(user.username.as_str()) {
            verdict.deny(format!(
                "spec.acl: user {:?} is listed twice; give each user one entry",
                user.username
            ));
        }
        // The operator itself connects as `default`; rewriting it would lock the operator out.
        if user.username == acl::DEFAULT_USER {
            verdict.deny(format!(
                "spec.acl[{index}].username: {:?} is Valkey's built-in user, which the operator uses and leaves alone; name your user differently",
                acl::DEFAULT_USER
            ));
        } else if acl::is_reserved(&user.username) {
            verdict.deny(format!(
                "spec.acl[{index}].username: {:?} is reserved for the operator's own user; name your user differently",
                user.username
            ));
        }
        for (granted, permission) in user.permissions.iter().enumerate() {
            if fleet.role(&permission.role_ref).is_none() {
                verdict.warn(clip(format!(
                    "spec.acl[{index}].permissions[{granted}].roleRef: ValkeyRole {} does not exist; user {} is not applied until it does.",
                    permission.role_ref, user.username
                )));
            }
        }
    }
}
