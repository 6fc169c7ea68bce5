int accelsim_abi_version(void) { return 1; }
