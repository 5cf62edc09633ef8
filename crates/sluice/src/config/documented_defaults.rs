//! Every default the docs state is the code's default.
