// Demo stimulus testbench for tests/designs/counter.sv (stimulus only, no checks), as a model should write it.
// Score it:  python sim.py score --rtl tests/designs/counter.sv --top counter --inst uut --tb examples/tb_counter.sv --target 90
`timescale 1ns/1ps
module tb_counter;
  reg clk = 0, rst_n = 0, load = 0, en = 0, up = 1;
  reg [3:0] d = 4'd0;
  wire [3:0] q;
  wire wrap;
  counter #(.W(4)) uut (.clk(clk), .rst_n(rst_n), .load(load), .en(en), .up(up), .d(d), .q(q), .wrap(wrap));
  always #5 clk = ~clk;
  integer i;
  initial begin
    #12 rst_n = 1;
    @(negedge clk) begin load = 1; d = 4'hA; end     // load a value
    @(negedge clk) begin load = 0; d = 4'h5; en = 1; end
    for (i = 0; i < 20; i = i + 1) @(negedge clk);   // count up through the wrap
    up = 0;
    for (i = 0; i < 20; i = i + 1) @(negedge clk);   // count down
    en = 0; load = 1; d = 4'hF; up = 1;
    @(negedge clk) begin load = 0; d = 4'h0; end
    @(negedge clk) rst_n = 0;                        // asynchronous reset again
    @(negedge clk) rst_n = 1;
    @(negedge clk) $finish;
  end
endmodule
