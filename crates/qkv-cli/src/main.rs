fn main() {
    println!("qkv");
}
