"""The private names of the libraries under the template, each in one module per library, listed there with
why it is used and the upstream issue; everything else uses their public API (the template checks it)."""
