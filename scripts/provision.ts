// Provisions what the test suite needs on this machine; installs Debian packages when root and missing.
console.log("provision: (placeholder)");
