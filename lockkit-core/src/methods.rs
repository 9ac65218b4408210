//! What the primitives share, written once so that they cannot drift apart: the options
//! methods of a [`Mutex`](crate::Mutex), a [`Semaphore`](crate::Semaphore) and an
//! [`RwLock`](crate::RwLock), and the methods every grant type built on a
//! [`MutexGuard`](crate::MutexGuard) has (a [`Permit`](crate::Permit), a
//! [`ReadGuard`](crate::ReadGuard), a [`WriteGuard`](crate::WriteGuard)).

/// Gives `$name`, a primitive with an `options: LockOptions` field, its `options`,
/// `with_ttl` and `with_options`, with `$what` ("mutex") in their docs.
macro_rules! option_methods {
    ($name:ident, $what:literal) => {
        impl $name {
            #[doc = concat!("The options this ", $what, "'s acquisitions use.")]
            pub fn options(&self) -> &$crate::LockOptions {
                &self.options
            }

            #[doc = concat!("Uses a different TTL for this ", $what, "'s grants.")]
            ///
            /// # Errors
            /// [`ErrorKind::InvalidConfig`]($crate::ErrorKind::InvalidConfig) for a TTL
            /// outside what [`LockOptions::validate`]($crate::LockOptions::validate) accepts.
            pub fn with_ttl(self, ttl: ::std::time::Duration) -> $crate::Result<Self> {
                let options = self.options.clone().with_ttl(ttl);
                self.with_options(options)
            }

            #[doc = concat!("Uses different options for this ", $what, ".")]
            ///
            /// # Errors
            /// [`ErrorKind::InvalidConfig`]($crate::ErrorKind::InvalidConfig) saying which
            /// option is wrong ([`LockOptions::validate`]($crate::LockOptions::validate)).
            pub fn with_options(mut self, options: $crate::LockOptions) -> $crate::Result<Self> {
                options.validate()?;
                self.options = options;
                Ok(self)
            }
        }
    };
}

/// Gives the newtype `$name(MutexGuard)` the guard's methods, with `$what` ("the permit",
/// "the read lock") in their docs.
macro_rules! grant_methods {
    ($name:ident, $what:literal) => {
        impl $name {
            /// The key this grant is of.
            pub fn key(&self) -> &$crate::LockKey {
                self.0.key()
            }

            #[doc = concat!("The fencing token of ", $what, ": pass it with every write it guards.")]
            pub fn fencing_token(&self) -> $crate::FencingToken {
                self.0.fencing_token()
            }

            #[doc = concat!("The TTL ", $what, " was taken with: how long a crash of this process keeps it taken.")]
            pub fn ttl(&self) -> ::std::time::Duration {
                self.0.ttl()
            }

            #[doc = concat!("Until when ", $what, " is known to be ours, by the local clock.")]
            pub fn valid_until(&self) -> ::std::time::Instant {
                self.0.valid_until()
            }

            /// How much of the validity is left now.
            pub fn remaining(&self) -> ::std::time::Duration {
                self.0.remaining()
            }

            #[doc = concat!("How much validity ", $what, " was handed out with: at least the backend's validity floor, whenever it is read.")]
            pub fn granted_validity(&self) -> ::std::time::Duration {
                self.0.granted_validity()
            }

            #[doc = concat!("A signal that fires when ", $what, " is lost.")]
            pub fn lost_signal(&self) -> $crate::LostSignal {
                self.0.lost_signal()
            }

            #[doc = concat!("Waits until ", $what, " is lost.")]
            pub fn lost(&self) -> impl ::std::future::Future<Output = ()> + Send + 'static {
                self.0.lost()
            }

            #[doc = concat!("Whether ", $what, " is known to be lost, or its validity has passed.")]
            pub fn is_lost(&self) -> bool {
                self.0.is_lost()
            }

            #[doc = concat!("Asks the backend whether ", $what, " is still held.")]
            ///
            /// # Errors
            /// Backend failures; the answer is then unknown.
            pub async fn is_held(&self) -> $crate::Result<bool> {
                self.0.is_held().await
            }

            #[doc = concat!("Renews ", $what, " now, instead of waiting for the background renewal.")]
            ///
            /// # Errors
            /// As [`MutexGuard::extend`]($crate::MutexGuard::extend).
            pub async fn extend(&self) -> $crate::Result<()> {
                self.0.extend().await
            }

            #[doc = concat!("Gives ", $what, " back and says whether it was still ours.")]
            ///
            /// # Errors
            /// As [`MutexGuard::release`]($crate::MutexGuard::release).
            pub async fn release(self) -> $crate::Result<bool> {
                self.0.release().await
            }

            /// The guard underneath, for what takes a [`MutexGuard`]($crate::MutexGuard) (a
            /// backend's own extension).
            pub fn as_guard(&self) -> &$crate::MutexGuard {
                &self.0
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("key", self.key())
                    .field("fencing_token", &self.fencing_token())
                    .field("lost", &self.is_lost())
                    .finish()
            }
        }
    };
}

pub(crate) use {grant_methods, option_methods};
