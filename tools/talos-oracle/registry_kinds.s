// registry_kinds.go declares registeredKinds without a body: this empty assembly file allows it.
