//! flannel's config and the delegate config it builds from it with a subnet.env.
#![no_main]

use cni_flannel::{build_delegate, delegate_type, NetConf};
use cni_fuzz::request;
use libfuzzer_sys::fuzz_target;
use subnetenv::SubnetEnv;

const SUBNET_ENV: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n\
FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\n\
FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

fuzz_target!(|data: &[u8]| {
    let Some(req) = request("ADD", data) else {
        return;
    };
    let Ok(conf) = NetConf::parse(&req.config) else {
        return;
    };
    let _ = conf.check_delegate();
    let env = SubnetEnv::parse(SUBNET_ENV).expect("the sample subnet.env parses");
    if let Ok(delegate) = build_delegate(&conf, &env) {
        let _ = delegate_type(&delegate);
    }
});
