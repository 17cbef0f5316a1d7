module tb;
  wire one;
  TopModule uut(.one(one));
  initial begin #10; $finish; end
endmodule
